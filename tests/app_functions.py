"""The Functions app's functions, listed once per test session.

``FunctionApp.get_functions()`` raises when it is called a second time for the same app, so
every test module takes the functions from here.
"""

from __future__ import annotations

import functools
from typing import Any

import function_app


@functools.cache
def functions() -> dict[str, Any]:
    """Function name → the indexed ``azure.functions`` function object."""
    return {f.get_function_name(): f for f in function_app.app.get_functions()}
