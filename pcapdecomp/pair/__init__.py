"""Stage 2, the capture points → one joined table: exchanges matched across the app and DB points (match),
through a proxy (proxy), capture loss repaired from the other point (repair), and the clocks aligned (clock,
clocks)."""
