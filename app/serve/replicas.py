"""Scale-out on plain Ray actors: each replica loads the model and runs its own scheduler (its own continuous
batches); the one FastAPI front sends each request to the replica with the fewest requests in flight.

Why not Ray Serve: `ray[serve]` adds some forty packages to a Ray install (grpcio, opencensus, google-api-core,
aiohttp, uvloop, virtualenv, py-spy, an HAProxy build, ...) and starts a controller and an HTTP proxy per node, for
what here is a list of actors and a counter. A replica's stream comes back through a Ray streaming generator.
"""

from __future__ import annotations

import logging
import queue

from specgen.app.serve.protocol import ApiError

log = logging.getLogger("specgen.serve")
MAX_STREAMS = 1024  # concurrent streams one replica serves (its actor's threads; each mostly waits)


class Replica:
    """A Ray actor: one model, one scheduler."""

    def __init__(self, options):
        from specgen.app.serve.server import load_scheduler

        self.scheduler = load_scheduler(options)

    def health(self) -> dict:
        return self.scheduler.health()

    def stream(self, request):
        """("ok", Admitted) or ("error", ApiError tuple) first, then the updates until every choice ended."""
        updates: queue.Queue = queue.Queue()
        try:
            admitted = self.scheduler.open(request, updates.put)
        except ApiError as exc:
            yield ("error", exc.to_tuple())
            return
        yield ("ok", admitted)
        remaining = set(admitted.tickets)
        while remaining:
            update = updates.get()
            yield update
            if update.finish_reason:
                remaining.discard(update.ticket)

    def cancel(self, tickets) -> None:
        self.scheduler.cancel(tickets)

    def snapshot(self) -> dict:
        return self.scheduler.metrics.snapshot()

    def close(self, grace_s: float) -> None:
        self.scheduler.close(grace_s)


class RayBackend:
    def __init__(self, options):
        import ray

        from specgen.app.serve.server import served_name

        ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
        actor = ray.remote(num_cpus=options.threads, max_concurrency=MAX_STREAMS)(Replica)
        self.ray, self.options, self.model_name = ray, options, served_name(options)
        self.replicas = [actor.remote(options) for _ in range(options.replicas)]
        self.in_flight = [0] * len(self.replicas)
        self.turn = 0
        ray.get([replica.health.remote() for replica in self.replicas])  # every model loaded before serving

    def _pick(self) -> int:
        """The least busy replica, ties taken in turn."""
        n = len(self.replicas)
        order = [(self.turn + k) % n for k in range(n)]
        best = min(order, key=lambda i: self.in_flight[i])
        self.turn = (best + 1) % n
        return best

    async def open(self, request):
        index = self._pick()
        self.in_flight[index] += 1
        try:
            stream = self.replicas[index].stream.options(num_returns="streaming").remote(request)
            status, value = await (await stream.__anext__())
        except BaseException:
            self.in_flight[index] -= 1
            raise
        if status == "error":
            self.in_flight[index] -= 1
            raise ApiError.from_tuple(value)
        admitted = value
        wrapped = type(admitted)(tuple(_global(index, t) for t in admitted.tickets), admitted.prompt_tokens,
                                 admitted.method)

        async def updates():
            try:
                async for ref in stream:
                    update = await ref
                    update.ticket = _global(index, update.ticket)
                    yield update
            finally:
                self.in_flight[index] -= 1
        return wrapped, updates()

    def cancel(self, tickets) -> None:
        by_replica: dict[int, list[int]] = {}
        for ticket in tickets:
            index, local = divmod(ticket, 1 << 40)
            by_replica.setdefault(index, []).append(local)
        for index, local in by_replica.items():
            self.replicas[index].cancel.remote(local)

    async def snapshots(self) -> list[dict]:
        return list(await _gather([replica.snapshot.remote() for replica in self.replicas]))

    async def health(self) -> list[dict]:
        return [dict(h, replica=i) for i, h in enumerate(await _gather([r.health.remote() for r in self.replicas]))]

    def drain(self) -> None:
        self.ray.get([replica.close.remote(self.options.grace_s) for replica in self.replicas])

    async def close(self) -> None:
        await _gather([replica.close.remote(self.options.grace_s) for replica in self.replicas])
        for replica in self.replicas:
            self.ray.kill(replica)


def _global(index: int, ticket: int) -> int:
    """A replica's ticket made unique across replicas (the replica in the high bits)."""
    return index * (1 << 40) + ticket


async def _gather(refs):
    import asyncio

    return await asyncio.gather(*refs)
