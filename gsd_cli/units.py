"""How gsd writes quantities for people: durations (progress lines, a training run's plan)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``3.6s``, ``42s``, ``7m46s``, ``2h05m``, ``3.1 days``."""
    s = max(0.0, float(seconds))
    if s < 10:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s" if s >= 60 else f"{s:.0f}s"
    if s < 2 * 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{s / 86400:.3g} days"
