"""The train step's speed on a CPU: per mode (step), its matmul shapes (gemms), where its time goes (cpu_profile,
variants), libgomp's spin-waiting (omp_wait), and beside the TRM reference's step (vs_reference, _reference_worker)."""
