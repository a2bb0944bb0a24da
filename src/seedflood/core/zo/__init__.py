"""The zeroth-order math: seeded directions (MeZO's and SubCGE), the two-point estimate, and applying complete steps in canonical order (replay, state hashes)."""
