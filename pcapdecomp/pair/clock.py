"""Clock offset and skew of the DB capture relative to an app capture, from segments seen at both points.

Model: θ(t) = θ_ref + ω·(t − ref), the DB clock minus the app clock at app-clock time t (ns).
Every TCP segment matched at both capture points is one constraint (see docs/clock.md):

- app→DB ("forward"), app timestamp a, DB timestamp b:  θ(a) ≤ b − a   (a point the line must stay below)
- DB→app ("reverse"), DB timestamp c, app timestamp e:  θ(e) ≥ c − e   (a point the line must stay above)

For a slope ω the feasible offsets at `ref` are [L(ω), U(ω)] with U(ω) = min_fwd(y − ω·x) (concave; only the
lower convex hull of the forward points matters) and L(ω) = max_rev(y − ω·x) (convex; upper hull of the reverse
points). The estimate maximises the gap U − L (the line farthest from both point clouds: Duda 1987; Zhang, Liu &
Xia 2002) and takes the middle of [L, U]. gap(ω) is concave and piecewise linear with its corners at the hull edge
slopes, so evaluating it at those slopes solves the linear program exactly — no solver needed.

Robustness: a wrong match can make the problem infeasible (gap < 0). Then the most isolated binding point is
dropped, one at a time, up to a small budget, and counted. If that is not enough, the clock stepped (Paxson 1998):
the capture is bisected in time until the pieces are feasible, neighbours are merged back while they stay
feasible, and each boundary is put where the fewest points disagree with the lines on either side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pcapdecomp.core.errors import UsageError

MAX_SKEW_PPM = 500.0  # ntpd never slews faster than 500 ppm; a larger fitted skew is a wrong model, not a clock
_TOL_NS = 1e-3  # float noise allowance when comparing gap values (they are ns, computed from values < 1e8)


@dataclass(frozen=True, slots=True)
class ClockSegment:
    """One stretch of app-clock time over which θ is a straight line."""

    start_ns: int  # app clock, first instant this line applies to (inclusive)
    end_ns: int  # app clock, exclusive
    ref_ns: int  # app-clock instant offset_ns and the bounds refer to (== start_ns)
    offset_ns: float  # estimated θ(ref_ns) = DB clock − app clock
    skew_ppm: float  # estimated ω·1e6; DB clock runs fast by this many µs per second
    lower_ns: float  # least θ(ref_ns) of any line consistent with all kept points (−inf if no reverse points)
    upper_ns: float  # greatest θ(ref_ns) of any consistent line (+inf if no forward points)
    skew_lower_ppm: float  # range of slopes of consistent lines (nan if the skew was not estimated)
    skew_upper_ppm: float
    n_fwd: int  # forward (app→DB) points used
    n_rev: int  # reverse (DB→app) points used
    n_excluded: int  # points dropped as impossible (wrong matches)

    @property
    def two_sided(self) -> bool:
        """True when both directions bounded the fit and the skew was estimated."""
        return not math.isnan(self.skew_lower_ppm)

    @property
    def feasible(self) -> bool:
        """False when no straight line separates the kept points: the bounds are then crossed (lower > upper)."""
        return self.lower_ns <= self.upper_ns

    def offset_at(self, app_ns: np.ndarray | int) -> np.ndarray | float:
        """θ at app-clock time(s), ns as float."""
        delta = np.asarray(app_ns, dtype=np.int64) - np.int64(self.ref_ns)
        result = self.offset_ns + (self.skew_ppm * 1e-6) * delta.astype(np.float64)
        return result if result.ndim else float(result)

    def bounds_at(self, app_ns: int) -> tuple[float, float]:
        """An interval that contains θ(app_ns) for every line consistent with the points.

        Exact at ref_ns; away from it widened by the skew interval (an outer bound, valid but not tight).
        """
        delta = float(int(app_ns) - self.ref_ns)
        if not self.two_sided:
            return self.lower_ns, self.upper_ns
        swing = (self.skew_lower_ppm * 1e-6 * delta, self.skew_upper_ppm * 1e-6 * delta)
        return self.lower_ns + min(swing), self.upper_ns + max(swing)


@dataclass(frozen=True)
class ClockModel:
    """Piecewise-linear θ(t) over the app capture's clock; segments sorted and contiguous."""

    segments: tuple[ClockSegment, ...]
    quality: str  # 'two-sided' (every segment bounded on both sides, skew fitted) | 'one-sided' | 'none'

    def _segment_index_app(self, app_ns: np.ndarray) -> np.ndarray:
        starts = np.array([s.start_ns for s in self.segments[1:]], dtype=np.int64)
        return np.searchsorted(starts, app_ns, side="right")

    def offset_at(self, app_ns: np.ndarray | int) -> np.ndarray | float:
        """θ (DB − app, ns as float) at app-clock time(s)."""
        app = np.asarray(app_ns, dtype=np.int64)
        if not self.segments:
            out = np.zeros(app.shape, dtype=np.float64)
            return out if out.ndim else float(out)
        if len(self.segments) == 1:
            return self.segments[0].offset_at(app_ns)
        which = self._segment_index_app(app)
        out = np.empty(app.shape, dtype=np.float64)
        for i, seg in enumerate(self.segments):
            sel = which == i
            out[sel] = seg.offset_at(app[sel])
        return out if out.ndim else float(out)

    def app_to_db(self, app_ns: np.ndarray | int) -> np.ndarray | int:
        """DB-clock time of an app-clock timestamp (int64 ns)."""
        app = np.asarray(app_ns, dtype=np.int64)
        out = app + np.rint(np.asarray(self.offset_at(app))).astype(np.int64)
        return out if out.ndim else int(out)

    def db_to_app(self, db_ns: np.ndarray | int) -> np.ndarray | int:
        """App-clock time of a DB-clock timestamp (int64 ns), inverting θ.

        The segment is chosen by where its start falls on the DB clock. After a backward step the same DB
        time occurs twice; it is then read with the later segment.
        """
        db = np.asarray(db_ns, dtype=np.int64)
        if not self.segments:
            return db.copy() if db.ndim else int(db)
        db_starts = np.array(
            [s.start_ns + int(round(s.offset_ns)) for s in self.segments[1:]], dtype=np.int64
        )
        which = np.searchsorted(db_starts, db, side="right")
        out = np.empty(db.shape, dtype=np.int64)
        for i, seg in enumerate(self.segments):
            sel = which == i
            # db = app + θ_ref + ω(app − ref)  ⇒  app − ref = (db − ref − θ_ref) / (1 + ω)
            since_ref = (db[sel] - np.int64(seg.ref_ns)).astype(np.float64) - seg.offset_ns
            out[sel] = np.int64(seg.ref_ns) + np.rint(since_ref / (1.0 + seg.skew_ppm * 1e-6)).astype(np.int64)
        return out if out.ndim else int(out)

    def segment_at(self, app_ns: int) -> ClockSegment | None:
        """The segment whose line applies at app-clock time app_ns (the first/last one outside the capture)."""
        if not self.segments:
            return None
        return self.segments[int(self._segment_index_app(np.asarray(app_ns, dtype=np.int64)))]

    def summary(self, db_first_ns: int) -> dict:
        """The figures a report prints: θ at the DB capture's first packet, its bounds, the fit's inputs."""
        samples = {"forward": sum(s.n_fwd for s in self.segments), "reverse": sum(s.n_rev for s in self.segments)}
        base = {
            "samples": samples,
            "excluded": sum(s.n_excluded for s in self.segments),
            "segments": len(self.segments),
            "quality": self.quality,
        }
        if not self.segments:
            return {"offset_s": None, "skew_ppm": None, "offset_bounds_s": [None, None], **base}
        app_first = int(self.db_to_app(int(db_first_ns)))
        seg = self.segment_at(app_first)
        lo, hi = seg.bounds_at(app_first)
        return {
            "offset_s": float(seg.offset_at(app_first)) / 1e9,
            "skew_ppm": seg.skew_ppm,
            "offset_bounds_s": [lo / 1e9, hi / 1e9],
            **base,
        }


# ---------------------------------------------------------------------------------------------------------------
# Convex hulls (vectorised quickhull) and the two-variable linear program


def _lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the lower convex hull's vertices, left to right. x must be sorted ascending.

    Quickhull: each step is one vectorised pass over the points still below the current chord, and those
    shrink fast, so a million points cost a few passes of numpy, not a Python loop per point.
    """
    n = len(x)
    if n == 0:
        return np.empty(0, dtype=np.intp)
    left_end = int(np.searchsorted(x, x[0], side="right"))
    i_left = int(np.argmin(y[:left_end]))
    right_start = int(np.searchsorted(x, x[-1], side="left"))
    i_right = right_start + int(np.argmin(y[right_start:]))
    if x[i_left] == x[i_right]:
        return np.array([i_left], dtype=np.intp)

    def below(i: int, j: int, cand: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = (x, y) if cand is None else (x[cand], y[cand])
        # (x[j] - x[i]) * (ys - y[i]) - (y[j] - y[i]) * (xs - x[i]), the same operations in place: two arrays of
        # the points at a time, not five (the clock fit's peak is these arrays)
        cross = ys - y[i]
        cross *= x[j] - x[i]
        run = xs - x[i]
        run *= y[j] - y[i]
        cross -= run
        del run, xs, ys
        keep = cross < 0
        idx = np.flatnonzero(keep) if cand is None else cand[keep]
        return idx, cross[keep]

    hull = [i_left, i_right]
    stack = [(i_left, i_right, *below(i_left, i_right, None))]
    while stack:
        i, j, cand, cross = stack.pop()
        if len(cand) == 0:
            continue
        k = int(cand[np.argmin(cross)])  # farthest below the chord i–j: a hull vertex
        hull.append(k)
        stack.append((i, k, *below(i, k, cand)))
        stack.append((k, j, *below(k, j, cand)))
    hull_arr = np.array(hull, dtype=np.intp)
    return hull_arr[np.argsort(x[hull_arr], kind="stable")]


def _edge_slopes(hx: np.ndarray, hy: np.ndarray) -> np.ndarray:
    return np.diff(hy) / np.diff(hx) if len(hx) > 1 else np.empty(0)


def _envelopes(fhx, fhy, rhx, rhy, omegas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """U(ω) = min over forward hull of (y − ωx), L(ω) = max over reverse hull, for each ω (chunked)."""
    upper = np.empty(len(omegas))
    lower = np.empty(len(omegas))
    step = max(1, 2_000_000 // max(1, len(fhx) + len(rhx)))
    for s in range(0, len(omegas), step):
        w = omegas[s : s + step, None]
        upper[s : s + step] = (fhy[None, :] - w * fhx[None, :]).min(axis=1) if len(fhx) else np.inf
        lower[s : s + step] = (rhy[None, :] - w * rhx[None, :]).max(axis=1) if len(rhx) else -np.inf
    return upper, lower


@dataclass(frozen=True, slots=True)
class _Fit:
    omega: float  # dimensionless skew
    offset: float  # θ at x = 0 (relative units of the caller)
    lower: float  # least θ(0) over consistent lines (or L(ω̂) if infeasible)
    upper: float
    omega_lower: float
    omega_upper: float
    gap: float  # U(ω̂) − L(ω̂); negative = no consistent line


def _solve(fhx, fhy, rhx, rhy, omega_max: float) -> _Fit:
    """Maximise U(ω) − L(ω) over |ω| ≤ omega_max, given the two hulls (x relative to the reference)."""
    corners = np.concatenate((_edge_slopes(fhx, fhy), _edge_slopes(rhx, rhy), [-omega_max, omega_max]))
    omegas = np.unique(np.clip(corners, -omega_max, omega_max))
    upper, lower = _envelopes(fhx, fhy, rhx, rhy, omegas)
    gap = upper - lower
    k = int(np.argmax(gap))
    best = gap[k]
    # A flat top (two parallel binding edges) is a range of equally good slopes: take its middle.
    k0, k1 = k, k
    while k0 > 0 and gap[k0 - 1] >= best - _TOL_NS:
        k0 -= 1
    while k1 < len(omegas) - 1 and gap[k1 + 1] >= best - _TOL_NS:
        k1 += 1
    omega = 0.5 * (omegas[k0] + omegas[k1])
    (u_hat,), (l_hat,) = _envelopes(fhx, fhy, rhx, rhy, np.array([omega]))
    if u_hat - l_hat < 0:
        return _Fit(omega, 0.5 * (u_hat + l_hat), l_hat, u_hat, omega, omega, u_hat - l_hat)

    # Consistent slopes: where the concave, piecewise-linear gap is ≥ 0 (it is linear between corners).
    def root(i_out: int, i_in: int) -> float:
        g0, g1 = gap[i_out], gap[i_in]
        return omegas[i_out] + (0.0 - g0) * (omegas[i_in] - omegas[i_out]) / (g1 - g0)

    negative_left = np.flatnonzero(gap[:k0] < 0)
    omega_lo = omegas[0] if len(negative_left) == 0 else root(negative_left[-1], negative_left[-1] + 1)
    negative_right = k1 + 1 + np.flatnonzero(gap[k1 + 1 :] < 0)
    omega_hi = omegas[-1] if len(negative_right) == 0 else root(negative_right[0], negative_right[0] - 1)
    omega_lo, omega_hi = min(omega_lo, omega), max(omega_hi, omega)
    # θ(0) over all consistent lines: U is concave and L convex, so their extremes on [ω_lo, ω_hi] sit at the
    # interval's ends or at corners inside it.
    inside = omegas[(omegas > omega_lo) & (omegas < omega_hi)]
    probe = np.concatenate(([omega_lo, omega_hi], inside))
    u_probe, l_probe = _envelopes(fhx, fhy, rhx, rhy, probe)
    return _Fit(
        omega=omega,
        offset=0.5 * (u_hat + l_hat),
        lower=float(min(l_probe.min(), l_hat)),
        upper=float(max(u_probe.max(), u_hat)),
        omega_lower=float(omega_lo),
        omega_upper=float(omega_hi),
        gap=float(u_hat - l_hat),
    )


@dataclass(frozen=True, slots=True)
class _Result:
    fit: _Fit
    n_fwd: int
    n_rev: int
    n_excluded: int

    @property
    def feasible(self) -> bool:
        return self.fit.gap >= 0


def _hull_without(x: np.ndarray, y: np.ndarray, keep: np.ndarray, hull: np.ndarray, pos: int) -> np.ndarray:
    """The lower hull after dropping vertex hull[pos] (already cleared in `keep`).

    Only the stretch between its two neighbouring vertices changes, and those neighbours stay vertices, so the
    hull is recomputed on that stretch alone (x sorted, so it is a slice) and spliced in.
    """
    a = int(hull[pos - 1]) if pos > 0 else 0
    b = int(hull[pos + 1]) + 1 if pos + 1 < len(hull) else len(x)
    idx = a + np.flatnonzero(keep[a:b])
    patch = idx[_lower_hull(x[idx], y[idx])]
    return np.concatenate((hull[: max(pos - 1, 0)], patch, hull[pos + 2 :]))


_NEIGHBOURS = 32  # points on each side of a suspect that stand for "its neighbourhood"


def _isolation(x: np.ndarray, y: np.ndarray, keep: np.ndarray, i: int, omega: float) -> float:
    """How far point i lies below the median of its kept neighbours (residuals about slope ω), in ns."""
    lo, hi = max(0, i - _NEIGHBOURS), min(len(x), i + _NEIGHBOURS + 1)
    near = lo + np.flatnonzero(keep[lo:hi])
    near = near[near != i]
    if len(near) == 0:
        return 0.0
    return float(np.median(y[near] - omega * x[near]) - (y[i] - omega * x[i]))


def _fit_points(fx, fy, rx, ry, *, budget: int, omega_max: float) -> _Result:
    """Two-sided fit on points (x sorted, relative to the reference), dropping ≤ budget impossible points."""
    f_keep = np.ones(len(fx), dtype=bool)
    r_keep = np.ones(len(rx), dtype=bool)
    ry_neg = -ry  # the upper hull of the reverse points is the lower hull of their mirror image
    fh = _lower_hull(fx, fy)
    rh = _lower_hull(rx, ry_neg)
    excluded = 0
    while True:
        fit = _solve(fx[fh], fy[fh], rx[rh], ry[rh], omega_max)
        if fit.gap >= 0 or excluded >= budget:
            break
        # Infeasible. Drop whichever binding point stands farther out from its neighbours in time. The test is
        # local on purpose: while a wrong match still tilts ω̂, good points at the ends of the capture look extreme
        # against the whole cloud, but not against the points sent just before and after them.
        f_pos = int(np.argmin(fy[fh] - fit.omega * fx[fh]))  # the binding points are hull vertices
        r_pos = int(np.argmax(ry[rh] - fit.omega * rx[rh]))
        f_isolation = _isolation(fx, fy, f_keep, int(fh[f_pos]), fit.omega)
        r_isolation = _isolation(rx, ry_neg, r_keep, int(rh[r_pos]), -fit.omega)
        if f_isolation >= r_isolation and len(fh) > 1:
            f_keep[fh[f_pos]] = False
            fh = _hull_without(fx, fy, f_keep, fh, f_pos)
        elif len(rh) > 1:
            r_keep[rh[r_pos]] = False
            rh = _hull_without(rx, ry_neg, r_keep, rh, r_pos)
        else:
            break
        excluded += 1
    return _Result(fit, int(f_keep.sum()), int(r_keep.sum()), excluded)


# ---------------------------------------------------------------------------------------------------------------
# Estimation over a whole capture, with clock steps


class _Points:
    """Both directions, sorted by app time, as floats relative to a common origin (never absolute ns in float)."""

    def __init__(self, fwd_app, fwd_db, rev_db, rev_app):
        order_f = np.argsort(fwd_app, kind="stable")
        order_r = np.argsort(rev_app, kind="stable")
        self.f_app = fwd_app[order_f]
        self.r_app = rev_app[order_r]
        f_y = fwd_db[order_f]  # int64, exact: θ + delay (the differences made in place: one array, not two)
        f_y -= self.f_app
        r_y = rev_db[order_r]  # θ − delay
        r_y -= self.r_app
        del order_f, order_r
        firsts = [a[0] for a in (self.f_app, self.r_app) if len(a)]
        self.t0 = int(min(firsts))
        self.t_end = int(max(a[-1] for a in (self.f_app, self.r_app) if len(a))) + 1
        self.y0 = int(np.min(f_y)) if len(f_y) else int(np.max(r_y))
        self.fx = (self.f_app - np.int64(self.t0)).astype(np.float64)
        self.rx = (self.r_app - np.int64(self.t0)).astype(np.float64)
        self.fy = (f_y - np.int64(self.y0)).astype(np.float64)
        self.ry = (r_y - np.int64(self.y0)).astype(np.float64)

    def slices(self, lo: int, hi: int) -> tuple[slice, slice]:
        """Points with app time in [lo, hi)."""
        f = slice(*np.searchsorted(self.f_app, [lo, hi], side="left"))
        r = slice(*np.searchsorted(self.r_app, [lo, hi], side="left"))
        return f, r


@dataclass(frozen=True, slots=True)
class _Piece:
    lo: int  # app-clock ns, inclusive
    hi: int  # exclusive
    result: _Result | None  # None when a direction has no point (nothing to be infeasible with)
    n_fwd: int
    n_rev: int

    @property
    def feasible(self) -> bool:
        return self.result is None or self.result.feasible


class _Estimator:
    def __init__(self, pts: _Points, *, min_points: int, max_excluded: int, max_excluded_fraction: float,
                 omega_max: float):
        self.pts = pts
        self.min_points = min_points
        self.max_excluded = max_excluded
        self.max_excluded_fraction = max_excluded_fraction
        self.omega_max = omega_max

    def budget(self, n: int) -> int:
        return min(self.max_excluded, int(self.max_excluded_fraction * n))

    def counts(self, lo: int, hi: int) -> tuple[int, int]:
        f, r = self.pts.slices(lo, hi)
        return f.stop - f.start, r.stop - r.start

    def piece(self, lo: int, hi: int) -> _Piece:
        p = self.pts
        f, r = p.slices(lo, hi)
        nf, nr = f.stop - f.start, r.stop - r.start
        if nf == 0 or nr == 0:
            return _Piece(lo, hi, None, nf, nr)
        x0 = float(lo - p.t0)
        result = _fit_points(p.fx[f] - x0, p.fy[f], p.rx[r] - x0, p.ry[r],
                             budget=self.budget(nf + nr), omega_max=self.omega_max)
        return _Piece(lo, hi, result, nf, nr)

    def split(self, lo: int, hi: int, whole: _Piece | None = None) -> list[_Piece]:
        """Bisect [lo, hi) in time until every piece is feasible or too small to split."""
        piece = whole or self.piece(lo, hi)
        if piece.n_fwd + piece.n_rev == 0:
            return []
        if piece.feasible or piece.n_fwd + piece.n_rev < 2 * self.min_points or hi - lo < 2:
            return [piece]
        mid = lo + (hi - lo) // 2
        return self.split(lo, mid) + self.split(mid, hi)

    def merge(self, pieces: list[_Piece]) -> list[_Piece]:
        """Join neighbours while the union still has a consistent line (with its exclusion budget)."""
        merged: list[_Piece] = []
        current = pieces[0]
        for nxt in pieces[1:]:
            union = self.piece(current.lo, nxt.hi)
            if union.feasible:
                current = union
            else:
                merged.append(current)
                current = nxt
        merged.append(current)
        return merged

    def line(self, piece: _Piece) -> tuple[float, float, float]:
        """(x_ref, θ at x_ref, ω) in the relative units of _Points."""
        fit = piece.result.fit
        return float(piece.lo - self.pts.t0), fit.offset, fit.omega

    def boundary(self, left: _Piece, right: _Piece, lo: int) -> int:
        """The app time in [lo, right.hi) where the fewest points disagree with the line on their side."""
        p = self.pts
        f, r = p.slices(lo, right.hi)
        x = np.concatenate((p.fx[f], p.rx[r]))
        order = np.argsort(x, kind="stable")
        x = x[order]

        def disagree(piece: _Piece) -> np.ndarray:
            x_ref, theta, omega = self.line(piece)
            f_bad = p.fy[f] < theta + omega * (p.fx[f] - x_ref)  # a forward point below the line
            r_bad = p.ry[r] > theta + omega * (p.rx[r] - x_ref)  # a reverse point above it
            return np.concatenate((f_bad, r_bad))[order].astype(np.int64)

        bad_left = np.concatenate(([0], np.cumsum(disagree(left))))
        bad_right = np.concatenate(([0], np.cumsum(disagree(right))))
        cost = bad_left + (bad_right[-1] - bad_right)  # cost[k]: first k points go left
        best = np.flatnonzero(cost == cost.min())
        k_lo, k_hi = int(best[0]), int(best[-1])
        k_lo, k_hi = max(k_lo, 1), min(max(k_hi, 1), len(x) - 1)
        between = 0.5 * (x[k_lo - 1] + x[k_hi])
        return int(p.t0 + round(between))


def _one_sided(pts: _Points, f: slice, r: slice, lo: int, hi: int) -> ClockSegment:
    """Without points in both directions the skew cannot be fitted: take ω = 0 and the plain bounds."""
    upper = float(pts.fy[f].min()) + pts.y0 if f.stop > f.start else math.inf
    lower = float(pts.ry[r].max()) + pts.y0 if r.stop > r.start else -math.inf
    if math.isinf(upper) and math.isinf(lower):
        offset = 0.0
    elif math.isinf(upper):
        offset = lower
    elif math.isinf(lower):
        offset = upper
    else:
        offset = 0.5 * (lower + upper)
    return ClockSegment(lo, hi, lo, offset, 0.0, lower, upper, math.nan, math.nan,
                        int(f.stop - f.start), int(r.stop - r.start), 0)


def _segment(est: _Estimator, lo: int, hi: int, fitted: _Piece | None = None) -> ClockSegment:
    pts = est.pts
    f, r = pts.slices(lo, hi)
    if f.stop - f.start < est.min_points or r.stop - r.start < est.min_points:
        return _one_sided(pts, f, r, lo, hi)
    return _two_sided(lo, hi, pts.y0, (fitted or est.piece(lo, hi)).result)


def _two_sided(lo: int, hi: int, y0: int, res: _Result) -> ClockSegment:
    """The segment [lo, hi) of a two-sided fit made in units relative to `y0` (_Points.y0)."""
    fit = res.fit
    return ClockSegment(
        start_ns=lo, end_ns=hi, ref_ns=lo,
        offset_ns=float(y0 + fit.offset), skew_ppm=float(fit.omega * 1e6),
        lower_ns=float(y0 + fit.lower), upper_ns=float(y0 + fit.upper),
        skew_lower_ppm=float(fit.omega_lower * 1e6), skew_upper_ppm=float(fit.omega_upper * 1e6),
        n_fwd=res.n_fwd, n_rev=res.n_rev, n_excluded=res.n_excluded,
    )


def _as_ns(name: str, values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise UsageError(f"{name} must be a one-dimensional array of integer nanoseconds")
    return arr.astype(np.int64, copy=False)  # not a copy of what is int64 already: the samples are read only


def estimate_clock(
    fwd_app_ns,
    fwd_db_ns,
    rev_db_ns,
    rev_app_ns,
    *,
    min_points: int = 20,
    max_excluded: int = 50,
    max_excluded_fraction: float = 0.01,
    max_skew_ppm: float = MAX_SKEW_PPM,
) -> ClockModel:
    """Fit θ(t) = DB clock − app clock from segments seen at both capture points.

    fwd_*: app→DB segments (app send time, DB arrival time); rev_*: DB→app (DB send time, app arrival time),
    all int64 ns, pairwise aligned. A direction with fewer than `min_points` points gives a one-sided fit
    (skew 0, the plain bound). Up to min(max_excluded, max_excluded_fraction·n) impossible points per segment
    are dropped and counted; past that the capture is split at clock steps.
    """
    fwd_app, fwd_db = _as_ns("fwd_app_ns", fwd_app_ns), _as_ns("fwd_db_ns", fwd_db_ns)
    rev_db, rev_app = _as_ns("rev_db_ns", rev_db_ns), _as_ns("rev_app_ns", rev_app_ns)
    if len(fwd_app) != len(fwd_db) or len(rev_db) != len(rev_app):
        raise UsageError("clock samples: each direction needs as many app as DB timestamps")
    if min_points < 2 or max_excluded < 0 or not 0 <= max_excluded_fraction < 0.5 or max_skew_ppm <= 0:
        raise UsageError("clock fit: min_points ≥ 2, max_excluded ≥ 0, 0 ≤ fraction < 0.5, max skew > 0")
    if len(fwd_app) + len(rev_app) == 0:
        return ClockModel((), "none")
    pts = _Points(fwd_app, fwd_db, rev_db, rev_app)
    est = _Estimator(pts, min_points=min_points, max_excluded=max_excluded,
                     max_excluded_fraction=max_excluded_fraction, omega_max=max_skew_ppm * 1e-6)
    lo, hi = pts.t0, pts.t_end
    if len(fwd_app) < min_points or len(rev_app) < min_points:
        f, r = pts.slices(lo, hi)
        return ClockModel((_one_sided(pts, f, r, lo, hi),), "one-sided")

    whole = est.piece(lo, hi)
    if whole.feasible:
        return ClockModel((_segment(est, lo, hi, whole),), "two-sided")

    pieces = est.merge(est.split(lo, hi, whole))
    # Pieces too thin to fit on their own (a few points around a step) are left for the boundary search.
    kept = [p for p in pieces if p.result is not None and p.n_fwd >= min_points and p.n_rev >= min_points]
    if len(kept) <= 1:
        return ClockModel((_segment(est, lo, hi),), "two-sided")
    bounds = [lo]
    for left, right in zip(kept, kept[1:]):
        bounds.append(max(bounds[-1] + 1, est.boundary(left, right, bounds[-1])))
    bounds.append(hi)
    # A boundary search can leave a sliver with too few points to fit; give it to its neighbour.
    for b in list(bounds[1:-1]):
        i = bounds.index(b)
        if not all(n >= min_points for n in est.counts(bounds[i - 1], b)) or not all(
            n >= min_points for n in est.counts(b, bounds[i + 1])
        ):
            bounds.remove(b)
    segments = tuple(_segment(est, a, b) for a, b in zip(bounds, bounds[1:]))
    quality = "two-sided" if all(s.two_sided for s in segments) else "one-sided"
    return ClockModel(segments, quality)


# ---------------------------------------------------------------------------------------------------------------
# The fit from hulls: what the samples come to while the whole capture has one consistent line


HULL_MARGIN_NS = 64.0  # a point this close above its piece's hull is kept (see ClockHulls)
HULL_SPAN_LIMIT = 1 << 46  # ns (19.5 hours): wider x or y spans take the samples' path (see fit_hulls)


@dataclass(frozen=True)
class ClockHulls:
    """Clock samples reduced to what estimate_clock reads of them while the whole capture has one consistent line
    with no point dropped: the forward points near their lower hull and the reverse points near their upper hull,
    with the counts and extremes of all the points. Pieces of the samples (any split of them) reduce alone and
    combine (`combined_hulls`): the hull of a union is the hull of the pieces' hulls.

    The fit decides with float cross products relative to the whole capture's origin (`_Points.t0`, `y0`), and
    those round once they pass 2^53: a point that is not a vertex of its piece's hull may then still be chosen
    by the fit over all points. So a piece keeps every point within HULL_MARGIN_NS above its own hull (a point
    that close to the whole capture's hull is that close to its piece's), not only the vertices; the rounding of
    `_lower_hull` is below 2^-51 of the y span between the points it compares (below 2^-5 ns under
    HULL_SPAN_LIMIT). Points sorted by (app time, y), the samples' order in `_Points`."""

    f_app: np.ndarray  # int64 ns: forward points' app time a
    f_y: np.ndarray  # int64 ns: b − a
    r_app: np.ndarray  # int64 ns: reverse points' app time e
    r_y: np.ndarray  # int64 ns: c − e
    n_fwd: int  # all the points of each direction, not only the kept ones
    n_rev: int
    t_first: int  # least and greatest app time of any point (0 without points)
    t_last: int
    f_y_min: int  # least and greatest y of each direction (0 without points)
    f_y_max: int
    r_y_min: int
    r_y_max: int


def _near_lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Positions of the points (int64 ns, any order) within HULL_MARGIN_NS above their lower convex hull."""
    order = np.argsort(x, kind="stable")  # _lower_hull needs x sorted, not y among equal x (a lexsort is 10× this)
    xs, ys = x[order], y[order]
    xf = (xs - xs[0]).astype(np.float64)  # floats of the piece's own spans
    yf = (ys - ys.min()).astype(np.float64)
    del xs, ys
    hull = _lower_hull(xf, yf)
    height = yf - np.interp(xf, xf[hull], yf[hull])
    return order[height <= HULL_MARGIN_NS]


def _kept(app: np.ndarray, y: np.ndarray, mirrored: bool) -> tuple[np.ndarray, np.ndarray]:
    """The points near the lower hull of (app, y), or of (app, −y) when `mirrored`, sorted by (app, y)."""
    if len(app) == 0:
        return app[:0], y[:0]
    near = _near_lower_hull(app, -y if mirrored else y)
    app, y = app[near], y[near]
    order = np.lexsort((y, app))
    return app[order], y[order]


def _reduced(f_app, f_y, r_app, r_y, counts: tuple[int, ...]) -> ClockHulls:
    f_app, f_y = _kept(f_app, f_y, mirrored=False)
    r_app, r_y = _kept(r_app, r_y, mirrored=True)
    return ClockHulls(f_app, f_y, r_app, r_y, *counts)


def clock_hulls(fwd_app_ns, fwd_db_ns, rev_db_ns, rev_app_ns) -> ClockHulls:
    """One piece of the samples (estimate_clock's arguments, any order) reduced to its hulls."""
    fwd_app, rev_app = _as_ns("fwd_app_ns", fwd_app_ns), _as_ns("rev_app_ns", rev_app_ns)
    f_y = _as_ns("fwd_db_ns", fwd_db_ns) - fwd_app
    r_y = _as_ns("rev_db_ns", rev_db_ns) - rev_app
    if len(f_y) != len(fwd_app) or len(r_y) != len(rev_app):
        raise UsageError("clock samples: each direction needs as many app as DB timestamps")
    app_times = [_extremes(a) for a in (fwd_app, rev_app) if len(a)]
    t_first = min((lo for lo, _ in app_times), default=0)
    t_last = max((hi for _, hi in app_times), default=0)
    return _reduced(fwd_app, f_y, rev_app, r_y,
                    (len(fwd_app), len(rev_app), t_first, t_last, *_extremes(f_y), *_extremes(r_y)))


def _extremes(values: np.ndarray) -> tuple[int, int]:
    return (int(values.min()), int(values.max())) if len(values) else (0, 0)


def combined_hulls(pieces: list[ClockHulls]) -> ClockHulls:
    """The hulls of the union of the pieces' samples."""
    with_f = [p for p in pieces if p.n_fwd]
    with_r = [p for p in pieces if p.n_rev]
    with_any = [p for p in pieces if p.n_fwd or p.n_rev]
    counts = (sum(p.n_fwd for p in pieces), sum(p.n_rev for p in pieces),
              min((p.t_first for p in with_any), default=0), max((p.t_last for p in with_any), default=0),
              min((p.f_y_min for p in with_f), default=0), max((p.f_y_max for p in with_f), default=0),
              min((p.r_y_min for p in with_r), default=0), max((p.r_y_max for p in with_r), default=0))
    joined = (np.concatenate([getattr(p, name) for p in pieces] or [np.empty(0, np.int64)])
              for name in ("f_app", "f_y", "r_app", "r_y"))
    return _reduced(*joined, counts)


def fit_hulls(hulls: ClockHulls, *, min_points: int = 20, max_skew_ppm: float = MAX_SKEW_PPM
              ) -> ClockModel | None:
    """estimate_clock's model of the samples `hulls` was made of, when the whole capture has a consistent line
    with no point dropped (the usual case); None when estimate_clock must read the samples: a direction with fewer
    than `min_points` points, no consistent line at once (it then drops points by their neighbours in time or
    splits the capture at clock steps), or a span past HULL_SPAN_LIMIT."""
    if hulls.n_fwd < min_points or hulls.n_rev < min_points:
        return None
    t0, t_end, y0 = hulls.t_first, hulls.t_last + 1, hulls.f_y_min  # _Points' origin
    if max(t_end - t0, hulls.f_y_max - y0, abs(hulls.r_y_min - y0), abs(hulls.r_y_max - y0)) >= HULL_SPAN_LIMIT:
        return None
    fx = (hulls.f_app - np.int64(t0)).astype(np.float64)
    rx = (hulls.r_app - np.int64(t0)).astype(np.float64)
    fy = (hulls.f_y - np.int64(y0)).astype(np.float64)
    ry = (hulls.r_y - np.int64(y0)).astype(np.float64)
    fh = _lower_hull(fx, fy)
    rh = _lower_hull(rx, -ry)
    fit = _solve(fx[fh], fy[fh], rx[rh], ry[rh], max_skew_ppm * 1e-6)
    if fit.gap < 0:
        return None
    return ClockModel((_two_sided(t0, t_end, y0, _Result(fit, hulls.n_fwd, hulls.n_rev, 0)),), "two-sided")
