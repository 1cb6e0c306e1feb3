"""One controller per API area."""

from __future__ import annotations

from gateway.routes.chat import ChatController
from gateway.routes.completions import CompletionsController
from gateway.routes.health import HealthController
from gateway.routes.messages import MessagesController
from gateway.routes.models import ModelsController

CONTROLLERS = [ChatController, CompletionsController, MessagesController, ModelsController, HealthController]
