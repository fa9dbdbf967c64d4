"""One small module per source of readings; each takes its OS root / library as an argument."""
