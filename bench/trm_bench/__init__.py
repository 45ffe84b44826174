"""TRM-Bench: every configuration's learning curve recorded once (tiny), read back (table), and every sampler x pruner
replayed on it (replay, pod, horizon, confirm), the default chosen (choice) and checked by a real study (check)."""
