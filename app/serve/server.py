"""Start-up: load the model into a scheduler (here, or in each Ray replica), build the app, run uvicorn."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

log = logging.getLogger("specgen.serve")


@dataclass(frozen=True)
class ServeOptions:
    model: str | None = None
    draft: str | None = None
    method: str | None = None  # None: the served model's default method
    rows: int = 8
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    replicas: int = 1  # > 1: Ray actors, each its own scheduler
    threads: int = 1
    grace_s: float = 10.0  # how long a shutdown lets running requests finish
    memory_budget_mb: float | None = None  # rows per lane cut so a lane of full-context requests fits (SpecMemo)


def served_name(options: ServeOptions) -> str:
    """The id clients send as `model`: --model as given, else the default model's short name."""
    if options.model:
        return options.model
    from specgen.modalities.text.generator import default_models

    return "gemma" if default_models()[0] == "gemma" else "specgen-code"


def load_scheduler(options: ServeOptions):
    """The model, its plain step time (the metrics' T_plain) and a running scheduler."""
    from specgen.app.serve.scheduler import Scheduler
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator(options.model, options.draft, threads=options.threads)
    ar_step_s = generator.measure_step_s(generator.example_prompt)  # also builds the compiled kernels
    rows = options.rows
    if options.memory_budget_mb is not None:
        import torch

        # any request may fill the context, so a lane is planned for full-context rows at the default method's
        # window (a request's own knobs are its own; the budget covers the default lane)
        rows, _, plan = generator.memory_plan(options.method, [torch.tensor([0])], generator.context_size - 1, rows,
                                              {}, options.memory_budget_mb, cut_window=False)
        log.warning("memory budget %g MB: %d rows per lane (predicted peak %.0f MB)", options.memory_budget_mb,
                    rows, plan.predicted_peak_mb)
    return Scheduler(generator, rows=rows, method=options.method, model_name=served_name(options),
                     ar_step_s=ar_step_s)


def build_app(options: ServeOptions):
    from specgen.app.serve.app import LocalBackend, create_app

    if options.replicas > 1:
        from specgen.app.serve.replicas import RayBackend

        backend = RayBackend(options)
    else:
        backend = LocalBackend(load_scheduler(options), grace_s=options.grace_s)
    return create_app(backend, api_key=options.api_key)


def run(options: ServeOptions) -> int:
    import uvicorn

    app = build_app(options)
    log.warning("serving %s on http://%s:%d/v1 (method %s, %d rows%s)", served_name(options), options.host,
                options.port, options.method or "default", options.rows,
                f", {options.replicas} replicas" if options.replicas > 1 else "")
    # uvicorn waits for open responses a little longer than the grace period: by then the drain has ended every
    # running request with a last event of its own, rather than uvicorn cutting the connections
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level="warning",
                            timeout_graceful_shutdown=int(options.grace_s) + 5)
    backend = app.state.backend

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                threading.Thread(target=backend.drain, name="specgen-drain", daemon=True).start()
            super().handle_exit(sig, frame)
            # uvicorn re-raises a caught SIGTERM/SIGINT after shutting down; a shutdown that completed is exit 0
            self._captured_signals.clear()

    Server(config).run()
    return 0
