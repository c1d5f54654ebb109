"""A small hand-made profile the planner's unit tests compute against by hand."""

from pdorch.planner.profile import DecodePoint, PrefillPoint, Profile

PROFILE = Profile(
    model="test", device="cpu", created="2026-01-01T00:00:00Z",
    prefill=(PrefillPoint(256, 4000.0, 0.1), PrefillPoint(1024, 5000.0, 0.3)),
    decode=(DecodePoint(1, 1024, 50.0, 0.02), DecodePoint(8, 1024, 200.0, 0.04), DecodePoint(16, 1024, 200.0, 0.08),
            DecodePoint(1, 2048, 33.0, 0.03), DecodePoint(8, 2048, 133.0, 0.06), DecodePoint(16, 2048, 133.0, 0.12)))
