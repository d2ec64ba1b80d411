"""atroposlib.envs.constants: the CLI's namespace names."""

ENV_NAMESPACE = "env"
OPENAI_NAMESPACE = "openai"
SERVER_MANAGER_NAMESPACE = "server"
NAMESPACE_SEP = "."
