"""Store adapters behind one port: memory (tests), SQLite (local default), Cosmos DB (Azure)."""

from agent_learning.store.base import NOT_MODIFIED, AgentCursor, FeedPage, NotModified, RawDoc, Store, Tagged
from agent_learning.store.memory import MemoryStore
from agent_learning.store.sqlite import SQLiteStore

__all__ = [
    "NOT_MODIFIED", "AgentCursor", "FeedPage", "MemoryStore", "NotModified", "RawDoc", "SQLiteStore", "Store", "Tagged",
]
