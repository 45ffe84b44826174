"""What pruning buys: the CPU proxy study once per pruner (studies), the arms compared where all have settled
(settled), and pruner rules replayed on its saved unpruned curves (evidence, replays, warmup)."""
