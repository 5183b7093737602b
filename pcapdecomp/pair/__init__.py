"""Stage 2, the capture points → one view (face: pairing.pair_points → Paired): exchanges matched across the app
and DB points (match), through a proxy (proxy), capture loss repaired from the other point (repair), the clock model
and its fit (clock) and its run per pair of points, from the segments both saw (clocks)."""
