"""The actor tree: a root, one supervisor per child session, one actor per activation."""

import logging

from actors._delivery import deliver
from actors._record import ActivationView
from actors.activation import ActivationActor
from actors.context import ActorContext
from actors.messages import (
    ActivationPlan,
    Reply,
    SendMessage,
    SpawnChild,
)
from actors.root import Passivator, RootActor, RootActorProxy
from actors.routing import Route, RoutingTable
from actors.supervisor import ChildSupervisor, ChildSupervisorProxy, follow_up_label

__all__ = [
    "ActivationActor",
    "ActivationPlan",
    "ActivationView",
    "ActorContext",
    "ChildSupervisor",
    "ChildSupervisorProxy",
    "Passivator",
    "Reply",
    "RootActor",
    "RootActorProxy",
    "Route",
    "RoutingTable",
    "SendMessage",
    "SpawnChild",
    "deliver",
    "follow_up_label",
]

# A library logs; the application decides where it goes (as pykka does for its own).
logging.getLogger(__name__).addHandler(logging.NullHandler())
