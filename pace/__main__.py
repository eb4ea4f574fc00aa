from pace.cli import main

raise SystemExit(main())
