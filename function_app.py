"""The Azure Functions app (Python v2 model). Wiring only: each trigger forwards to
``agent_learning.app.handlers``, which holds the logic and is tested without the host.

    enqueue  Cosmos DB change feed on `episodes`  → one Service Bus message per episode
    score    Service Bus queue                    → judges → shaped reward → `agent-scores`
    train    timer (AGENT_LEARNING_TRAIN_SCHEDULE) → one message per agent with new scores
    train_agent  Service Bus training queue       → REINFORCE update → new policy version
    policy   HTTP GET /api/policies/{agent_id}    → the agent's current policy (function key)
    feedback HTTP POST /api/episodes/{episode_id}/feedback → the caller's verdict, merged into the reward
    ingest   HTTP POST /api/agents/{agent_id}/episodes  → an agent's episode, for callers allowed to write it
    choose   HTTP POST /api/agents/{agent_id}/choose    → a configuration drawn from the agent's policy
    dashboard HTTP GET /api/dashboard, /api/dashboard/agents/{agent_id} → the operators' read-only pages (HTML)
    personalizer_*  HTTP /api/agents/{agent_id}/personalizer/...  → the Azure AI Personalizer API of the agent:
             every route of agent_learning.app.personalizer (rank, events, multislot, configurations, model,
             evaluations, logs); anonymous at the host, the app admits Personalizer keys and principals

Connections are identity-based: `CosmosDBConnection__accountEndpoint` and
`ServiceBusConnection__fullyQualifiedNamespace` (plus `__credential`/`__clientId`).
"""

import azure.functions as func

from agent_learning.app import handlers, http

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)


def _auth(name: str) -> func.AuthLevel:
    """The host checks the function key, except on routes whose clients send credentials it does
    not read (Personalizer's key header or Entra token): those admit their callers in the app."""
    return func.AuthLevel.ANONYMOUS if http.BY_NAME[name].own_keys else func.AuthLevel.FUNCTION


# The Cosmos trigger does not retry a failed batch by itself: retry it (with backoff) until
# Service Bus accepts it, so that no episode is skipped. Redelivered messages are deduplicated
# by their message id (the episode id).
@app.retry(
    strategy="exponential_backoff", max_retry_count="-1", minimum_interval="00:00:05", maximum_interval="00:05:00"
)
@app.cosmos_db_trigger(
    arg_name="documents",
    connection="CosmosDBConnection",
    database_name="%AGENT_LEARNING_COSMOS_DATABASE%",
    container_name="episodes",
    lease_container_name="leases",
    lease_container_prefix="%AGENT_LEARNING_LEASE_PREFIX%",
    create_lease_container_if_not_exists=False,
)
def enqueue(documents: func.DocumentList) -> None:
    handlers.enqueue(documents, handlers.runtime())


@app.service_bus_queue_trigger(
    arg_name="message",
    connection="ServiceBusConnection",
    queue_name="%AGENT_LEARNING_QUEUE_NAME%",
)
def score(message: func.ServiceBusMessage) -> None:
    handlers.score(message.get_body(), message.delivery_count or 1, message.message_id, handlers.runtime())


@app.timer_trigger(arg_name="timer", schedule="%AGENT_LEARNING_TRAIN_SCHEDULE%", run_on_startup=False, use_monitor=True)
def train(timer: func.TimerRequest) -> None:
    handlers.train(handlers.runtime())


@app.service_bus_queue_trigger(
    arg_name="message",
    connection="ServiceBusConnection",
    queue_name="%AGENT_LEARNING_TRAIN_QUEUE_NAME%",
)
def train_agent(message: func.ServiceBusMessage) -> None:
    handlers.train_agent(message.get_body(), message.delivery_count or 1, message.message_id, handlers.runtime())


@app.route(route=http.BY_NAME["policy"].template, methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def policy(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("policy", req)


@app.route(route=http.BY_NAME["feedback"].template, methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def feedback(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("feedback", req)


@app.route(route=http.BY_NAME["ingest"].template, methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def ingest(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("ingest", req)


@app.route(route=http.BY_NAME["choose"].template, methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def choose(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("choose", req)


@app.route(route=http.BY_NAME["dashboard"].template, methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def dashboard(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("dashboard", req)


@app.route(route=http.BY_NAME["dashboard_agent"].template, methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def dashboard_agent(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("dashboard_agent", req)


@app.route(route=http.BY_NAME["personalizer_rank"].template, methods=["POST"], auth_level=_auth("personalizer_rank"))
def personalizer_rank(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_rank", req)


@app.route(route=http.BY_NAME["personalizer_reward"].template, methods=["POST"],
           auth_level=_auth("personalizer_reward"))
def personalizer_reward(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_reward", req)


@app.route(route=http.BY_NAME["personalizer_activate"].template, methods=["POST"],
           auth_level=_auth("personalizer_activate"))
def personalizer_activate(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_activate", req)


@app.route(route=http.BY_NAME["personalizer_service_configuration"].template, methods=["GET", "PUT"],
           auth_level=_auth("personalizer_service_configuration"))
def personalizer_service_configuration(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_service_configuration", req)


@app.route(route=http.BY_NAME["personalizer_model"].template, methods=["GET", "PUT", "DELETE"],
           auth_level=_auth("personalizer_model"))
def personalizer_model(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_model", req)


@app.route(route=http.BY_NAME["personalizer_evaluations"].template, methods=["GET"],
           auth_level=_auth("personalizer_evaluations"))
def personalizer_evaluations(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_evaluations", req)


@app.route(route=http.BY_NAME["personalizer_evaluation"].template, methods=["GET", "PUT", "DELETE"],
           auth_level=_auth("personalizer_evaluation"))
def personalizer_evaluation(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_evaluation", req)


@app.route(route=http.BY_NAME["personalizer_multislot_rank"].template, methods=["POST"],
           auth_level=_auth("personalizer_multislot_rank"))
def personalizer_multislot_rank(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_multislot_rank", req)


@app.route(route=http.BY_NAME["personalizer_multislot_reward"].template, methods=["POST"],
           auth_level=_auth("personalizer_multislot_reward"))
def personalizer_multislot_reward(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_multislot_reward", req)


@app.route(route=http.BY_NAME["personalizer_multislot_activate"].template, methods=["POST"],
           auth_level=_auth("personalizer_multislot_activate"))
def personalizer_multislot_activate(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_multislot_activate", req)


@app.route(route=http.BY_NAME["personalizer_policy_configuration"].template, methods=["GET", "PUT", "DELETE"],
           auth_level=_auth("personalizer_policy_configuration"))
def personalizer_policy_configuration(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_policy_configuration", req)


@app.route(route=http.BY_NAME["personalizer_model_properties"].template, methods=["GET"],
           auth_level=_auth("personalizer_model_properties"))
def personalizer_model_properties(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_model_properties", req)


@app.route(route=http.BY_NAME["personalizer_log_properties"].template, methods=["GET"],
           auth_level=_auth("personalizer_log_properties"))
def personalizer_log_properties(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_log_properties", req)


@app.route(route=http.BY_NAME["personalizer_logs"].template, methods=["DELETE"], auth_level=_auth("personalizer_logs"))
def personalizer_logs(req: func.HttpRequest) -> func.HttpResponse:
    return _serve("personalizer_logs", req)


def _serve(name: str, req: func.HttpRequest) -> func.HttpResponse:
    """Route ``name`` of :mod:`agent_learning.app.http`, answering ``req``."""
    request = http.Request(req.method, dict(req.route_params), dict(req.params), dict(req.headers), req.get_body())
    answer = http.dispatch(name, request, handlers.runtime(), keys_checked=not http.BY_NAME[name].own_keys)
    headers = dict(answer.headers or {})
    return func.HttpResponse(
        answer.body, status_code=answer.status, headers=headers, mimetype=headers.pop("Content-Type", "text/plain")
    )
