"""modal.exception's names the corpus catches."""


class Error(Exception):
    pass


class RemoteError(Error):
    pass


class NotFoundError(Error):
    pass
