from agentik.core.cli import main

raise SystemExit(main())
