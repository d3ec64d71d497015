"""Hidden-state capture: the target model's features for offline EAGLE-3 training.

A second distributed stage beside generation: one task per row of ``eaglegen tokenize``
output, run by capture workers that load the target once per process, batch rows by token
budget, write one file per row atomically in SpecForge's or speculators' layout, and hand
the file's manifest line to the one writer of ``OUT_DIR/manifest.jsonl``.
"""
