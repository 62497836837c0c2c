"""Live snapshots of a vLLM engine: the scheduler plugin, its shared-memory region and the snapshotter sidecar.

`plugin` runs inside vLLM's EngineCore and imports only vLLM, the standard library and the small modules it needs here
(`region`, `writer`, `recorder`, `config`); everything else (`reader`, `wire`, `calibration`, `publisher`, `sidecar`,
`server`, `main`) is the sidecar's. This file imports nothing on purpose.
"""
