"""What an adapter is: the domain's centre, shared by the registry, the worker and training.

``format`` (directory layout, modes, types, content identity), ``families`` (LoRA, DiReFT,
LoReFT: what each family's files hold and how it is validated and applied), ``reft_format``
and ``reft_positions`` (ReFT-P configuration and the prompt positions it touches),
``peft_convert`` and ``pyreft_import`` (bringing PEFT and pyreft checkpoints in).
"""
