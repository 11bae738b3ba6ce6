"""What we know of SGLang, and how we ask the installed SGLang itself.

Holds the flag schema (bundled, or read from the server's interpreter by ``schema_probe``
through ``parser``), SGLang's launch-time resolution run in the server's interpreter
(``resolution`` driving ``resolve_probe``), lever sets (``levers``) and what a set must
satisfy to start (``lever_limits``), the parallel layout of ranks on GPUs (``layout``), and
the sglang-router client (``router``). The two ``*_probe`` modules run *inside SGLang's
interpreter* as ``-c`` source: they import nothing of ours.
May import: the shared vocabulary (top level). Nothing from ``engine``, ``host``,
``observe``, ``planner`` or ``sim``.
"""
