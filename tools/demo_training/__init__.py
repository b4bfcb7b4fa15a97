"""How the shipped models of runtime/demo/ were made: `python -m tools.demo_training.train` (the demo model and its
draft), `.train_adapter`, `.train_terse_adapter`, `.train_default_draft` (run from the repository's root). Not part
of the installed package."""
