"""`specgen serve`: an OpenAI-compatible HTTP server over continuous batching (docs/serving.md).

`protocol` parses and checks request bodies and shapes errors as the OpenAI API does; `scheduler` owns the model
and one decode thread that serves every lane (requests that share a method, its knobs and the sampling settings)
as its own continuous batch; `metrics` counts what was served and renders it for Prometheus; `app` is the
FastAPI front; `replicas` puts several schedulers on Ray actors behind that one front.
"""
