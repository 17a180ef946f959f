"""Store adapters behind one port: memory (tests), SQLite (local default), Cosmos DB (Azure)."""

from .base import NOT_MODIFIED, AgentCursor, FeedPage, NotModified, RawDoc, Store, Tagged
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = [
    "NOT_MODIFIED", "AgentCursor", "FeedPage", "MemoryStore", "NotModified", "RawDoc", "SQLiteStore", "Store", "Tagged",
]
