"""The HF Trainer with ``gradient_accumulation_steps=4`` over 5 micro-batches an epoch: each
epoch's second optimizer step accumulates 1 micro-batch, which the Trainer divides by 1
(``current_gradient_accumulation_steps``), not by 4. Prints the Trainer's own loss of every
step (``logging_steps=1``) as ``loss STEP VALUE``.

argv: OUT_DIR
"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
gen = torch.Generator().manual_seed(5)
rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (10, 16), generator=gen)]


class Print(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if logs and "loss" in logs:
            print("loss", state.global_step, repr(logs["loss"]), flush=True)


args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=2, gradient_accumulation_steps=4,
                         num_train_epochs=3, logging_steps=1, learning_rate=1e-3, lr_scheduler_type="constant",
                         report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
Trainer(model=model, args=args, train_dataset=rows, callbacks=[Print()]).train()
