"""The input layer: datasets, preprocessing recipes and the seeded, enterable pipelines."""
