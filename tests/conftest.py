"""Shared pytest configuration."""

pytest_plugins = ["tests.support.fixtures"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    """Print the figures the tests measured (latencies in seconds, counts as counts)."""
    from tests.support.rig import MEASURED

    if MEASURED:
        terminalreporter.section("measured by the tests")
        for name, pool, value, unit in sorted(MEASURED):
            shown = f"{value:8.4f} s" if unit == "s" else f"{value:8.0f} {unit}".rstrip()
            terminalreporter.write_line(f"{name:<40} {pool:<9} {shown}")
