"""What both daemons (and the command line) use that is not a wire format: logging, sd_notify,
the uvicorn runner, the model registry, runtime parameters, YAML and JSON-body helpers, token
files. Imports nothing else from Hydra."""
