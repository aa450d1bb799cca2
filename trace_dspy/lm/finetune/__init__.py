"""Fine-tuning the embedded model: LoRA training (``lora``), llama.cpp's adapter format (``gguf_lora``) and DSPy's
fine-tuning provider (``provider``, the ``dspy.BootstrapFinetune`` route).

Training needs the ``finetune`` extra (peft, gguf, accelerate, transformers) and torch (the ``embed`` extra);
every heavy import happens inside a function, so importing this package imports none of them.
"""
