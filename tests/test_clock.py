"""Clock offset/skew estimation against synthetic captures whose true clocks are known.

The generator is physical: true send times on the app clock, one-way delays = a fixed minimum (propagation +
stack) plus jitter plus rare millisecond spikes, the DB clock = app clock + θ0 + ω·t (+ an optional step), both
captures truncated to whole microseconds like classic pcap. Nothing is derived from the estimator's output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.core.errors import UsageError
from pcapdecomp.pair.clock import (ClockModel, _lower_hull, _Points, _solve, clock_hulls, combined_hulls,
                                   estimate_clock, fit_hulls)

T0 = 1_700_000_000_000_000_000  # ~2023 in ns: absolute values this large must never go through float64 raw
US = 1_000
MS = 1_000_000
S = 1_000_000_000


@dataclass
class Truth:
    theta0_ns: float
    skew_ppm: float
    step_at_ns: int | None = None  # app-clock time of a DB clock step
    step_ns: float = 0.0

    def theta(self, app_ns) -> np.ndarray:
        """True DB − app at app-clock time(s). Computed relative to T0 in int64 first, like the code must."""
        t = np.asarray(app_ns, dtype=np.int64)
        th = self.theta0_ns + self.skew_ppm * 1e-6 * (t - T0).astype(np.float64)
        if self.step_at_ns is not None:
            th = th + np.where(t >= self.step_at_ns, self.step_ns, 0.0)
        return th


@dataclass
class Capture:
    fwd_app: np.ndarray
    fwd_db: np.ndarray
    rev_db: np.ndarray
    rev_app: np.ndarray
    rev_send_app: np.ndarray  # true app-clock send time of each reverse segment (for conversion checks)
    min_fwd_delay: float  # smallest one-way delay actually drawn per direction
    min_rev_delay: float

    def args(self):
        return self.fwd_app, self.fwd_db, self.rev_db, self.rev_app


def _delays(rng, n, d_min, jitter, spike_rate):
    d = d_min + rng.lognormal(math.log(jitter), 0.8, n)
    spikes = rng.random(n) < spike_rate
    d[spikes] += rng.exponential(3 * MS, int(spikes.sum()))  # a loaded host or a retransmit-sized stall
    return d


def make_capture(truth: Truth, *, seed=0, n=2000, duration_s=20.0, d_min_fwd=40 * US, d_min_rev=40 * US,
                 jitter=15 * US, spike_rate=0.01) -> Capture:
    rng = np.random.default_rng(seed)
    span = int(duration_s * S)
    quantise = lambda t: (t // US) * US  # noqa: E731 - pcap µs timestamps truncate

    send = T0 + np.sort(rng.integers(0, span, n))  # app→DB: leaves the app host (app clock = true time)
    d = _delays(rng, n, d_min_fwd, jitter, spike_rate)
    arrive = send + np.rint(d).astype(np.int64)
    fwd_db = arrive + np.rint(truth.theta(arrive)).astype(np.int64)  # DB host stamps it on its own clock

    rsend = T0 + np.sort(rng.integers(0, span, n))  # DB→app
    d_r = _delays(rng, n, d_min_rev, jitter, spike_rate)
    rev_db = rsend + np.rint(truth.theta(rsend)).astype(np.int64)
    rev_app = rsend + np.rint(d_r).astype(np.int64)
    return Capture(quantise(send), quantise(fwd_db), quantise(rev_db), quantise(rev_app), rsend,
                   float(d.min()), float(d_r.min()))


def _check_segment_accuracy(model: ClockModel, truth: Truth, t_from: int, t_to: int, tolerance_ns: float):
    """|θ̂ − θ| ≤ tolerance at both ends of [t_from, t_to] (the error of a line is extreme at its ends)."""
    for t in (t_from, t_to):
        err = float(model.offset_at(t)) - float(truth.theta(t))
        assert abs(err) <= tolerance_ns, (t - T0, err)


# -- exactness of the geometry --------------------------------------------------------------------------------


def _lower_hull_reference(points):
    """Andrew's monotone chain, plain Python: the textbook algorithm the vectorised quickhull must agree with."""
    pts = sorted(set(points))
    hull = []
    for p in pts:
        while len(hull) >= 2 and (hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1]) - (hull[-1][1] - hull[-2][1]) * (
            p[0] - hull[-2][0]
        ) <= 0:
            hull.pop()
        hull.append(p)
    # keep only the lowest point of the first and last x column (the lower hull's ends)
    return [p for p in hull if not (p[0] == pts[0][0] and p[1] > min(q[1] for q in pts if q[0] == p[0]))
            and not (p[0] == pts[-1][0] and p[1] > min(q[1] for q in pts if q[0] == p[0]))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(-50, 50)), min_size=1, max_size=60))
def test_lower_hull_matches_monotone_chain(points):
    pts = sorted(points)
    x = np.array([p[0] for p in pts], dtype=np.float64)
    y = np.array([p[1] for p in pts], dtype=np.float64)
    got = [(int(x[i]), int(y[i])) for i in _lower_hull(x, y)]
    assert got == _lower_hull_reference(points)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 400)), min_size=1, max_size=25),
    st.lists(st.tuples(st.integers(0, 1000), st.integers(-400, 0)), min_size=1, max_size=25),
)
def test_linear_program_beats_a_dense_grid(fwd, rev):
    """The gap found is the true maximum: no slope on a fine grid does better, and it is attained at ω̂."""
    omega_max = 2.0
    fx, fy = (np.array(sorted(fwd), dtype=float).T)
    rx, ry = (np.array(sorted(rev), dtype=float).T)
    fit = _solve(fx[_lower_hull(fx, fy)], fy[_lower_hull(fx, fy)], rx[_lower_hull(rx, -ry)],
                 ry[_lower_hull(rx, -ry)], omega_max)
    gap_at = lambda w: (fy - w * fx).min() - (ry - w * rx).max()  # noqa: E731 - brute force over all points
    grid = np.linspace(-omega_max, omega_max, 4001)
    # the same brute force at every grid slope at once (a row per slope)
    lowest_fwd = (fy[None, :] - grid[:, None] * fx[None, :]).min(axis=1)
    highest_rev = (ry[None, :] - grid[:, None] * rx[None, :]).max(axis=1)
    grid_gaps = lowest_fwd - highest_rev
    assert grid_gaps.max() <= fit.gap + 1e-6
    assert gap_at(fit.omega) == pytest.approx(fit.gap, abs=1e-6)
    if fit.gap >= 0:
        # every grid slope with a non-negative gap lies in the reported slope range, and its offsets in the bounds
        for w, rev_max, fwd_min in zip(grid, highest_rev, lowest_fwd):
            if fwd_min - rev_max >= 1e-9:
                assert fit.omega_lower - 1e-9 <= w <= fit.omega_upper + 1e-9
                assert fit.lower - 1e-6 <= rev_max and fwd_min <= fit.upper + 1e-6


# -- accuracy on realistic captures ---------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    theta0_ms=st.floats(-800, 800),
    skew_ppm=st.floats(-50, 50),
    d_min_fwd_us=st.floats(20, 80),
    d_min_rev_us=st.floats(20, 80),
    jitter_us=st.floats(3, 50),
    duration_s=st.floats(10, 60),
    seed=st.integers(0, 2**32 - 1),
)
def test_offset_and_skew_recovered(theta0_ms, skew_ppm, d_min_fwd_us, d_min_rev_us, jitter_us, duration_s, seed):
    truth = Truth(theta0_ms * MS, skew_ppm)
    cap = make_capture(truth, seed=seed, duration_s=duration_s, d_min_fwd=d_min_fwd_us * US,
                       d_min_rev=d_min_rev_us * US, jitter=jitter_us * US)
    model = estimate_clock(*cap.args())
    assert model.quality == "two-sided"
    (seg,) = model.segments
    assert seg.n_fwd == seg.n_rev == 2000 and seg.n_excluded == 0  # every point is physically possible

    # The true line is one of the consistent lines, so it lies inside the reported intervals.
    assert seg.lower_ns <= float(truth.theta(seg.ref_ns)) <= seg.upper_ns
    assert seg.skew_lower_ppm <= skew_ppm <= seg.skew_upper_ppm
    # Acceptance: 0.3 ms / 5 ppm. The method does far better: the error is half the path asymmetry plus the
    # jitter of the fastest packets, under the minimum round trip; skew well under 1 ppm over ≥ 10 s.
    min_rtt = d_min_fwd_us * US + d_min_rev_us * US
    _check_segment_accuracy(model, truth, seg.start_ns, seg.end_ns - 1, min(min_rtt, 0.3 * MS))
    assert abs(seg.skew_ppm - skew_ppm) <= 1.0

    # Conversions: a DB send timestamp maps back to its true app-clock send time (µs truncation + fit error).
    back = model.db_to_app(cap.rev_db)
    assert np.abs(back - cap.rev_send_app).max() <= min_rtt + 2 * US
    assert np.abs(model.db_to_app(model.app_to_db(cap.fwd_app)) - cap.fwd_app).max() <= 1  # rounding only


def test_summary_reports_offset_at_db_first_packet():
    truth = Truth(-437.25 * MS, 31.0)
    cap = make_capture(truth, seed=7, duration_s=30)
    model = estimate_clock(*cap.args())
    db_first = int(min(cap.fwd_db.min(), cap.rev_db.min()))
    s = model.summary(db_first)
    app_first = db_first - truth.theta0_ns  # skew changes this by < 1 ns·ppm·s here, far below the check
    assert abs(s["offset_s"] - float(truth.theta(int(app_first))) / 1e9) < 80e-6
    lo, hi = s["offset_bounds_s"]
    assert lo <= float(truth.theta(int(app_first))) / 1e9 <= hi
    assert abs(s["skew_ppm"] - 31.0) < 1.0
    assert s["samples"] == {"forward": 2000, "reverse": 2000}
    assert (s["segments"], s["quality"], s["excluded"]) == (1, "two-sided", 0)


# -- clock steps ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step_ms", [5.0, -5.0, 1.0])
def test_clock_step_gives_two_accurate_segments(step_ms):
    step_at = T0 + 20 * S
    truth = Truth(250 * MS, -12.0, step_at_ns=step_at, step_ns=step_ms * MS)
    cap = make_capture(truth, seed=11, n=4000, duration_s=40)
    model = estimate_clock(*cap.args())
    assert model.quality == "two-sided"
    first, second = model.segments
    assert first.end_ns == second.start_ns
    # The step can only be placed between the last point before it and the first after (~10 ms apart here).
    assert abs(second.start_ns - step_at) < 50 * MS
    guard = 50 * MS
    _check_segment_accuracy(model, truth, first.start_ns, step_at - guard, 80 * US)
    _check_segment_accuracy(model, truth, step_at + guard, second.end_ns - 1, 80 * US)
    assert abs(first.skew_ppm + 12.0) <= 1.0 and abs(second.skew_ppm + 12.0) <= 1.0
    # DB timestamps away from the step convert with the right segment.
    away = np.abs(cap.rev_send_app - step_at) > guard
    assert np.abs(model.db_to_app(cap.rev_db[away]) - cap.rev_send_app[away]).max() <= 82 * US


# -- degraded inputs ------------------------------------------------------------------------------------------


def test_one_direction_only_gives_the_plain_bound():
    truth = Truth(123.4 * MS, 0.0)
    cap = make_capture(truth, seed=3)
    fwd_only = estimate_clock(cap.fwd_app, cap.fwd_db, cap.rev_db[:0], cap.rev_app[:0])
    assert fwd_only.quality == "one-sided"
    (seg,) = fwd_only.segments
    assert not seg.two_sided and seg.skew_ppm == 0.0 and seg.lower_ns == -math.inf
    assert seg.upper_ns == float((cap.fwd_db - cap.fwd_app).min())  # θ ≤ min(b − a)
    assert truth.theta0_ns <= seg.upper_ns <= truth.theta0_ns + cap.min_fwd_delay + US

    rev_only = estimate_clock(cap.fwd_app[:0], cap.fwd_db[:0], cap.rev_db, cap.rev_app)
    (seg,) = rev_only.segments
    assert rev_only.quality == "one-sided" and seg.upper_ns == math.inf
    assert seg.lower_ns == float((cap.rev_db - cap.rev_app).max())  # θ ≥ max(c − e)
    assert truth.theta0_ns - cap.min_rev_delay - US <= seg.lower_ns <= truth.theta0_ns


def test_too_few_points_in_one_direction_is_one_sided_with_both_bounds():
    truth = Truth(-5 * MS, 0.0)
    cap = make_capture(truth, seed=4)
    model = estimate_clock(cap.fwd_app, cap.fwd_db, cap.rev_db[:5], cap.rev_app[:5], min_points=20)
    assert model.quality == "one-sided"
    (seg,) = model.segments
    assert seg.lower_ns <= truth.theta0_ns <= seg.upper_ns
    assert (seg.n_fwd, seg.n_rev) == (2000, 5)


def test_no_points_at_all():
    empty = np.empty(0, dtype=np.int64)
    model = estimate_clock(empty, empty, empty, empty)
    assert model.quality == "none" and model.segments == ()
    assert model.db_to_app(T0) == T0 and model.offset_at(T0) == 0.0
    assert model.summary(T0)["offset_s"] is None


def test_impossible_points_are_excluded_and_counted():
    truth = Truth(-700 * MS, -45.0)
    cap = make_capture(truth, seed=5, n=4000)
    fwd_db, rev_db = cap.fwd_db.copy(), cap.rev_db.copy()
    # Wrong matches: a forward segment "arriving" before it was sent, a reverse one arriving before it left.
    bad_f = np.array([100, 1500, 2900, 3000, 3999])
    fwd_db[bad_f] = cap.fwd_app[bad_f] + np.rint(truth.theta(cap.fwd_app[bad_f])).astype(np.int64) - 2 * MS
    bad_r = np.array([0, 50, 2500])
    rev_db[bad_r] = cap.rev_app[bad_r] + np.rint(truth.theta(cap.rev_app[bad_r])).astype(np.int64) + 1 * MS
    rev_db[3000] += 100 * MS
    model = estimate_clock(cap.fwd_app, fwd_db, rev_db, cap.rev_app)
    (seg,) = model.segments
    assert seg.n_excluded == 9
    assert (seg.n_fwd, seg.n_rev) == (3995, 3996)
    _check_segment_accuracy(model, truth, seg.start_ns, seg.end_ns - 1, 80 * US)
    assert abs(seg.skew_ppm + 45.0) <= 1.0
    assert seg.lower_ns <= float(truth.theta(seg.ref_ns)) <= seg.upper_ns


def test_bad_arguments_are_usage_errors():
    a = np.arange(5, dtype=np.int64)
    with pytest.raises(UsageError):
        estimate_clock(a, a[:4], a, a)
    with pytest.raises(UsageError):
        estimate_clock(a.astype(float), a, a, a)
    with pytest.raises(UsageError):
        estimate_clock(a, a, a, a, min_points=1)


def test_a_million_points_fit_accurately():
    """Half a million samples each way (the hull keeps the fit cheap; its speed is a benchmark matter, not a test)."""
    truth = Truth(612 * MS, 17.0)
    cap = make_capture(truth, seed=9, n=500_000, duration_s=60)
    model = estimate_clock(*cap.args())
    (seg,) = model.segments
    assert abs(seg.skew_ppm - 17.0) <= 0.2
    _check_segment_accuracy(model, truth, seg.start_ns, seg.end_ns - 1, 80 * US)


def test_two_steps_give_three_segments():
    truth = Truth(-80 * MS, 8.0, step_at_ns=T0 + 15 * S, step_ns=3 * MS)
    cap = make_capture(truth, seed=21, n=6000, duration_s=45)
    # a second step back by 7 ms at 30 s, applied to the DB timestamps after it
    late_f = cap.fwd_db >= T0 + 30 * S + truth.theta0_ns
    late_r = cap.rev_send_app >= T0 + 30 * S
    fwd_db, rev_db = cap.fwd_db - np.where(late_f, 7 * MS, 0), cap.rev_db - np.where(late_r, 7 * MS, 0)
    model = estimate_clock(cap.fwd_app, fwd_db, rev_db, cap.rev_app)
    starts = [s.start_ns - T0 for s in model.segments]
    assert len(starts) == 3
    assert abs(starts[1] - 15 * S) < 50 * MS and abs(starts[2] - 30 * S) < 50 * MS
    expected = [0.0, 3 * MS, -4 * MS]  # step on top of θ0 + ω·t in each segment
    for seg, extra in zip(model.segments, expected):
        mid = (seg.start_ns + seg.end_ns) // 2
        assert abs(float(model.offset_at(mid)) - (float(Truth(truth.theta0_ns, 8.0).theta(mid)) + extra)) < 80 * US
        assert abs(seg.skew_ppm - 8.0) <= 1.0


def test_points_at_one_instant_leave_the_skew_open():
    at = np.full(100, T0 + 5 * S, dtype=np.int64)
    model = estimate_clock(at, at + 5 * MS, at + 3 * MS, at)
    (seg,) = model.segments
    assert (seg.lower_ns, seg.upper_ns, seg.offset_ns) == (3 * MS, 5 * MS, 4 * MS)
    assert seg.skew_ppm == 0.0 and (seg.skew_lower_ppm, seg.skew_upper_ppm) == (-500.0, 500.0)


# -- the fit from hulls (what the clock's segment pass keeps of the samples) ----------------------------------


def _in_sample_order(fwd_app, fwd_db, rev_db, rev_app):
    """The samples in the order pair_segments hands them over: by app time, then DB time."""
    f = np.lexsort((fwd_db, fwd_app))
    r = np.lexsort((rev_db, rev_app))
    return fwd_app[f], fwd_db[f], rev_db[r], rev_app[r]


def _hulls_in_pieces(samples, piece_of_f, piece_of_r, pieces: int):
    fwd_app, fwd_db, rev_db, rev_app = samples
    return combined_hulls([clock_hulls(fwd_app[piece_of_f == k], fwd_db[piece_of_f == k],
                                       rev_db[piece_of_r == k], rev_app[piece_of_r == k]) for k in range(pieces)])


def _hull_values(x, y):
    h = _lower_hull(x, y)
    return x[h].tolist(), y[h].tolist()


@settings(max_examples=150, deadline=None)
@given(
    n_fwd=st.integers(1, 400),
    n_rev=st.integers(1, 400),
    span_log2=st.integers(10, 43),  # up to 2^43 ns: a capture of over two hours
    quantum=st.sampled_from([1, 1_000]),  # ns or µs timestamps
    skew=st.integers(-499, 499),  # the line's slope, in ppm
    kink=st.integers(-50, 50),  # a second slope after the middle: a convex corner to be found
    gap=st.integers(1, 5),  # quanta between the forward and the reverse line
    heights=st.lists(st.integers(0, 3), min_size=1, max_size=8),  # how far above the line: mostly on it
    pieces=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
)
def test_hulls_of_pieces_are_the_hull_of_all_points(n_fwd, n_rev, span_log2, quantum, skew, kink, gap, heights,
                                                    pieces, seed):
    """Collinear and near-collinear clouds (points on an integer-rounded line and a hair above it, many at one
    instant, cross products far beyond 2^53), cut into pieces at random: the hull of the pieces' hulls has the
    vertices of the hull of all the points, in the fit's units (_Points' origin), and the fit from hulls is
    estimate_clock's to the last bit."""
    rng = np.random.default_rng(seed)
    span = (1 << span_log2) // quantum

    def cloud(n, above):
        k = np.sort(rng.integers(0, span, n))
        k[rng.random(n) < 0.3] = k[0]  # many points at one instant
        line = (skew * k) // 1_000_000 + np.where(k > span // 2, (kink * (k - span // 2)) // 1_000_000, 0)
        off = rng.choice(np.array(heights), n)
        return T0 + k * quantum, (line + (off if above else -gap - off)) * quantum

    fwd_app, fwd_y = cloud(n_fwd, above=True)
    rev_app, rev_y = cloud(n_rev, above=False)
    theta = 123_456_789_000
    samples = _in_sample_order(fwd_app, fwd_app + fwd_y + theta, rev_app + rev_y + theta, rev_app)
    hulls = _hulls_in_pieces(samples, rng.integers(0, pieces, n_fwd), rng.integers(0, pieces, n_rev), pieces)

    pts = _Points(*samples)
    assert (hulls.n_fwd, hulls.n_rev, hulls.t_first, hulls.t_last + 1, hulls.f_y_min) == \
        (n_fwd, n_rev, pts.t0, pts.t_end, pts.y0)
    as_x = lambda app: (app - np.int64(pts.t0)).astype(np.float64)  # noqa: E731 - _Points' units
    as_y = lambda y: (y - np.int64(pts.y0)).astype(np.float64)  # noqa: E731
    assert _hull_values(as_x(hulls.f_app), as_y(hulls.f_y)) == _hull_values(pts.fx, pts.fy)
    assert _hull_values(as_x(hulls.r_app), -as_y(hulls.r_y)) == _hull_values(pts.rx, -pts.ry)
    model = fit_hulls(hulls)
    whole = estimate_clock(*samples)
    if model is not None:
        assert repr(model) == repr(whole)
    else:  # only where estimate_clock does more than fit the whole capture's hulls at once
        assert min(n_fwd, n_rev) < 20 or len(whole.segments) > 1 or whole.segments[0].n_excluded > 0 \
            or not whole.segments[0].feasible


@settings(max_examples=20, deadline=None)
@given(theta0_ms=st.floats(-800, 800), skew_ppm=st.floats(-50, 50), duration_s=st.floats(1, 60),
       pieces=st.integers(1, 30), seed=st.integers(0, 2**32 - 1))
def test_fit_from_hulls_is_estimate_clocks_fit(theta0_ms, skew_ppm, duration_s, pieces, seed):
    """On realistic captures (delays with spikes, µs stamps) the whole capture has one consistent line: the
    model from hulls is the one estimate_clock fits on all the samples, bit for bit."""
    cap = make_capture(Truth(theta0_ms * MS, skew_ppm), seed=seed, duration_s=duration_s)
    samples = _in_sample_order(*cap.args())
    rng = np.random.default_rng(seed)
    hulls = _hulls_in_pieces(samples, rng.integers(0, pieces, len(samples[0])),
                             rng.integers(0, pieces, len(samples[3])), pieces)
    model = fit_hulls(hulls)
    assert model is not None and repr(model) == repr(estimate_clock(*samples))
    assert len(hulls.f_app) + len(hulls.r_app) < 0.1 * (len(samples[0]) + len(samples[3]))  # it reduces


def test_fit_from_hulls_leaves_steps_and_thin_directions_to_the_samples():
    """A stepped clock has no consistent line at once, and a direction with fewer than min_points points is
    one-sided: there the hulls give no model, and the samples are fitted as before."""
    stepped = make_capture(Truth(5 * MS, 10.0, step_at_ns=T0 + 10 * S, step_ns=2 * MS), seed=3)
    samples = _in_sample_order(*stepped.args())
    assert fit_hulls(clock_hulls(*samples)) is None
    assert len(estimate_clock(*samples).segments) == 2
    cap = make_capture(Truth(5 * MS, 10.0), seed=4)
    thin = _in_sample_order(cap.fwd_app, cap.fwd_db, cap.rev_db[:5], cap.rev_app[:5])
    assert fit_hulls(clock_hulls(*thin)) is None
    assert estimate_clock(*thin).quality == "one-sided"
    far = _in_sample_order(cap.fwd_app, cap.fwd_db + (cap.fwd_app - T0) * 5_000, cap.rev_db, cap.rev_app)
    assert fit_hulls(clock_hulls(*far)) is None  # 5,000 ppm: no line within the skew limit
