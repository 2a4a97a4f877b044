"""Small shared utilities (seeding, logging, test fixtures)."""
