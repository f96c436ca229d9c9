"""The baselines the project is measured against, in the same run."""
