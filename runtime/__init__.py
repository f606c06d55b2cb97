"""asyncrl runtime: scheduler core, config, CLI."""
