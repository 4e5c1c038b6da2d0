"""Running a topology: the stage registry, the process runner, health endpoints."""
