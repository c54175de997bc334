"""The actor tree: a root, one supervisor per child session, one actor per activation."""

import logging

from actors.activation import ActivationActor
from actors.context import ActorContext
from actors.messages import (
    ActivationPlan,
    Redirect,
    SendMessage,
    SendReply,
    SpawnChild,
    Steered,
)
from actors.root import Passivator, RootActor, RootActorProxy
from actors.routing import Route, RoutingTable
from actors.supervisor import ChildSupervisor, ChildSupervisorProxy, follow_up_label

__all__ = [
    "ActivationActor",
    "ActivationPlan",
    "ActorContext",
    "ChildSupervisor",
    "ChildSupervisorProxy",
    "Passivator",
    "Redirect",
    "RootActor",
    "RootActorProxy",
    "Route",
    "RoutingTable",
    "SendMessage",
    "SendReply",
    "SpawnChild",
    "Steered",
    "follow_up_label",
]

# A library logs; the application decides where it goes (as pykka does for its own).
logging.getLogger(__name__).addHandler(logging.NullHandler())
