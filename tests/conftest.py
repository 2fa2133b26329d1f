"""Shared pytest configuration."""

pytest_plugins = ["tests.support.fixtures"]

#: The figures the xdist workers measured, gathered in the controller as each worker ends.
_FROM_WORKERS: list[tuple[str, str, float, str]] = []


def pytest_sessionfinish(session):  # type: ignore[no-untyped-def]
    """In an xdist worker: hand the figures this process measured to the controller."""
    from tests.support.rig import MEASURED

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["measured"] = [list(row) for row in MEASURED]


def pytest_configure(config):  # type: ignore[no-untyped-def]
    """With xdist, collect each worker's figures when it ends (the hook exists only then)."""
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorkerFigures())


class _WorkerFigures:
    def pytest_testnodedown(self, node, error):  # type: ignore[no-untyped-def]
        rows = getattr(node, "workeroutput", {}).get("measured", [])
        _FROM_WORKERS.extend((str(n), str(p), float(v), str(u)) for n, p, v, u in rows)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    """Print the figures the tests measured (latencies in seconds, counts as counts)."""
    from tests.support.rig import MEASURED

    rows = MEASURED + _FROM_WORKERS
    if rows:
        terminalreporter.section("measured by the tests")
        for name, pool, value, unit in sorted(rows):
            shown = f"{value:8.4f} s" if unit == "s" else f"{value:8.0f} {unit}".rstrip()
            terminalreporter.write_line(f"{name:<40} {pool:<9} {shown}")
