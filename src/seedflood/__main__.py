from seedflood.cli import main

raise SystemExit(main())
