"""Persistence: SQLAlchemy 2 models, Alembic migrations, repositories."""
