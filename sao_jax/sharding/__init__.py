"""Device mesh construction and the one logical-axis -> mesh-axis rules table."""
