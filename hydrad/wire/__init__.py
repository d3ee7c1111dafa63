"""Everything that crosses a process boundary, shared by the engine, the coordinator, the
command line and the console: bus messages, the merged-port codec and its client, the KV
stream format, OpenAI request parsing, stage names and the error table. Imports only
``hydrad.common``; never a plane."""
