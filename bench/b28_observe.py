"""B28: what observability costs. Server CPU per streamed HTTP turn (B4's turn: create, SSE,
POST, read to End; a 100-token reply) of four ``agentik serve`` processes side by side, in
alternating rounds, streaming from the same fake OpenAI-compatible process:

- ``without``: the otel and metrics plugins not loaded (``AGENTIK_DISABLE_PLUGINS``);
- ``off``: installed but off (the default);
- ``traces``: ``AGENTIK_OTEL=1``, exporting over OTLP/HTTP to a receiver in this process (the
  SDK's batch exporter with its defaults: a batch every 5 s, from its own thread);
- ``metrics``: ``AGENTIK_METRICS=1`` (for information).

A round's CPU is the server's schedstat delta (all threads: the exporter's too) over its turns,
divided by the turns. A ratio is the median over rounds of one round's value to the round of
the other server run just before it (paired: the load of the shared machine drifts between
rounds far more than the difference measured).
"""

from __future__ import annotations

from typing import Any

import common
from aiohttp import web
from common import CpuMeter, TurnClient, row, spec_text, stats

TOKENS = 100


async def receiver() -> tuple[web.AppRunner, int, list[int]]:
    """An OTLP/HTTP trace receiver: counts the bytes of each export and answers 200."""
    sizes: list[int] = []

    async def traces(request: web.Request) -> web.Response:
        sizes.append(len(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = common.free_port()
    await web.TCPSite(runner, common.HOST, port).start()
    return runner, port, sizes


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 21, 3)
    per_round = 8 if args.quick else 20
    runner, port, exports = await receiver()
    fake = common.start_fake()
    configs = {
        "without": {"AGENTIK_DISABLE_PLUGINS": "agentik_otel,agentik_metrics"},
        "off": {},
        "traces": {
            "AGENTIK_OTEL": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{common.HOST}:{port}",
        },
        "metrics": {"AGENTIK_METRICS": "1"},
    }
    servers = {name: common.start_agentik(fake.port, **env) for name, env in configs.items()}
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    try:
        async with common.session() as s:
            clients = {name: TurnClient(p.port, s) for name, p in servers.items()}
            for name, c in clients.items():  # warm-up and a check of each
                for _ in range(3):
                    assert (await c.turn(spec_text(TOKENS)))["tokens"] == TOKENS, name
            for _ in range(reps):
                for name, c in clients.items():
                    with CpuMeter(servers[name].pid) as m:
                        for _ in range(per_round):
                            await c.turn(spec_text(TOKENS))
                    cpu[name].append(m.ns / 1e3 / per_round)
    finally:
        common.stop_all(*servers.values(), fake)
        await runner.cleanup()
    st = {name: stats(v) for name, v in cpu.items()}

    def paired(a: str, b: str) -> dict[str, float]:
        """The ratios of each round's ``a`` to the ``b`` run next to it: the machine's drift
        (other work on it) cancels, which the medians of the two series alone do not."""
        return stats(x / y for x, y in zip(cpu[a], cpu[b], strict=True))

    off, traces, metrics = (
        paired("off", "without"),
        paired("traces", "off"),
        paired("metrics", "off"),
    )
    rows = [
        row(
            "server CPU per streamed turn: plugins installed but off vs not loaded",
            st["off"],
            st["without"],
            unit="µs",
            target="≤ 1.02x",
            ratio=off["median"],
            met=off["median"] <= 1.02,
            note=f"median of paired rounds (p95 {off['p95']:.3f}x); medians alone "
            f"{st['off']['median'] / st['without']['median']:.3f}x",
        ),
        row(
            "server CPU per streamed turn: traces on (OTLP/HTTP export) vs off",
            st["traces"],
            st["off"],
            unit="µs",
            target="≤ 1.15x",
            ratio=traces["median"],
            met=traces["median"] <= 1.15,
            note=f"median of paired rounds (p95 {traces['p95']:.3f}x); medians alone "
            f"{st['traces']['median'] / st['off']['median']:.3f}x; {len(exports)} exports, "
            f"{sum(exports) // 1024} KiB",
        ),
        row(
            "server CPU per streamed turn: metrics on vs off",
            st["metrics"],
            st["off"],
            unit="µs",
            ratio=metrics["median"],
            target="(info)",
            note=f"median of paired rounds (p95 {metrics['p95']:.3f}x)",
        ),
    ]
    notes = [
        f"{reps} alternating rounds of {per_round} turns per server (without, off, traces, "
        f"metrics); {TOKENS}-token replies, "
        "a new conversation per turn; each value is a round's server CPU / its turns",
        "the load client, the fake, the receiver and the four servers share the machine",
    ]
    return {
        "id": "B28",
        "title": "observability: traces and metrics on, off, not loaded",
        "rows": rows,
        "notes": notes,
        "raw": {
            "cpu_us": st,
            "paired": {"off/without": off, "traces/off": traces, "metrics/off": metrics},
        },
    }


if __name__ == "__main__":
    common.cli(main)
