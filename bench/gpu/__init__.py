"""The GPU benches: the train.kernels candidates against the reference (candidates, gradient_check, tile_check,
kernel_curves, profile), run in one prepared device call (call.sh, session), rendered into docs (docs); and what
the Triton kernels compile to on Hopper, read without a GPU (triton_sm90)."""
