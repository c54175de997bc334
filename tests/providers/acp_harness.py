"""A harness in a process of its own, for the tests that SIGKILL it mid-turn.

``python acp_harness.py DB_URL AGENT_COMMAND...`` opens a control plane on the database,
starts one ACP child running ``AGENT_COMMAND``, then waits on its stdin, as a harness waits
for work, until the test kills it.
"""

from __future__ import annotations

import sys

from controlplane import AcpProvider, ContinuableStartSpec, SubagentControl, TextBlock


def main() -> None:
    url, *command = sys.argv[1:]
    control = SubagentControl.open(url)
    control.providers.register(AcpProvider(command, grace_s=0.5, start_timeout_s=30.0))
    parent = control.agents.register("parent-1")
    control.start_continuable(
        ContinuableStartSpec(
            provider="acp", label="acp child", prompt=[TextBlock(text="work")], parent=parent
        )
    )
    sys.stdin.read()


if __name__ == "__main__":
    main()
