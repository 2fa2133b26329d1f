"""Shared pytest configuration."""

pytest_plugins = ["tests.support.fixtures"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    """Print the latencies the fault tests measured (figures for the closing note)."""
    from tests.support.rig import MEASURED

    if MEASURED:
        terminalreporter.section("measured by the fault tests (seconds)")
        for name, pool, seconds in sorted(MEASURED):
            terminalreporter.write_line(f"{name:<40} {pool:<9} {seconds:8.4f}")
