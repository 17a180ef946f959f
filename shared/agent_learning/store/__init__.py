"""Store adapters behind one port: memory (tests), SQLite (local default), Cosmos DB (Azure)."""

from .base import FeedPage, RawDoc, Store, Tagged
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["FeedPage", "MemoryStore", "RawDoc", "SQLiteStore", "Store", "Tagged"]
