"""ReFT-P: prefill-only DiReFT / LoReFT interventions inside vLLM's model runner.

ReFT adapters travel through vLLM exactly like LoRA adapters (a ``LoRARequest`` naming a
directory), so the scheduler's slot accounting, the OpenAI server and the gateway treat
both types alike; the model runner routes ReFT requests here instead of to vLLM's LoRA
manager, and forward hooks on the decoder layers apply the interventions.
"""
