"""atroposlib.utils: the helpers env files import."""

__all__: list[str] = []
