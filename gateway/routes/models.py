"""GET /v1/models and GET /v1/models/{model_id}."""

from __future__ import annotations

from litestar import Controller, Request, Response, get

from gateway.errors import APIError
from gateway.routes.common import gateway_state, json_response, unix_time
from gateway.schemas.openai_common import ModelCard, ModelList


class ModelsController(Controller):
    path = "/v1/models"

    @get("")
    async def list_models(self, request: Request) -> Response:
        state = gateway_state(request)
        engine = state.serving_engine()
        created = unix_time()
        cards = [ModelCard(name, created, engine.max_model_len, root=engine.model_name)
                 for name in state.served_model_names]
        return json_response(ModelList(cards))

    @get("/{model_id:path}")
    async def get_model(self, request: Request, model_id: str) -> Response:
        state = gateway_state(request)
        engine = state.serving_engine()
        model_id = model_id.lstrip("/")
        if model_id not in state.served_model_names:
            raise APIError(404, f"The model {model_id!r} does not exist", param="model", code="model_not_found")
        return json_response(ModelCard(model_id, unix_time(), engine.max_model_len, root=engine.model_name))
