from vllm_use.cli import main

raise SystemExit(main())
