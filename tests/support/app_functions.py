"""The Functions app's functions, listed once per test session, and their trigger input types.

``FunctionApp.get_functions()`` raises when it is called a second time for the same app, so
every test module takes the functions from here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import azure.functions as func
from azure.functions.servicebus import ServiceBusMessage

import function_app
from agent_learning.app import handlers


@functools.cache
def functions() -> dict[str, Any]:
    """Function name → the indexed ``azure.functions`` function object."""
    return {f.get_function_name(): f for f in function_app.app.get_functions()}


def document_list(docs: Iterable[Mapping[str, Any]]) -> func.DocumentList:
    """A Cosmos DB trigger batch of these documents."""
    return func.DocumentList([func.Document.from_dict(dict(d)) for d in docs])


def sb_message(received: Any) -> ServiceBusMessage:
    """The Service Bus trigger's message type, built from a queue delivery (``ReceivedMessage``)."""
    return ServiceBusMessage(
        body=received.body,
        message_id=received.message_id,
        delivery_count=received.delivery_count,
        application_properties=dict(received.properties),
        user_properties=dict(received.properties),
        content_type="application/json",
    )


def trust_principal_header(monkeypatch: Any, trusted: bool = True) -> None:
    """Make the app's current runtime state (or not) that App Service Authentication is on."""
    rt = handlers.runtime()
    monkeypatch.setattr(rt, "settings", rt.settings.model_copy(update={"trust_principal_header": trusted}))
