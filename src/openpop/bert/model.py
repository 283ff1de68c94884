"""BERT for pretraining (masked LM + next-sentence prediction), split over virtual IPUs.

The modules and their initialisation are Hugging Face ``transformers``' ``BertForPreTraining``
built from a ``BertConfig`` (nothing is downloaded); parameter names are the same, so a state
dict loads into ``BertForPreTraining``. The forward pass is this file's own, as in the recipe:

* self-attention computes Q, K and V with one fused matmul and ``scaled_dot_product_attention``;
* the MLM head runs only on the ``mask_tokens`` masked positions, not on every token;
* losses are the MLM cross entropy (label 0 = padding, ignored) plus the NSP cross entropy,
  marked with ``identity_loss``; accuracies are returned next to them.

Mixed precision is not the model's business: ``train.get_options`` turns on openpop's
``Options.Precision.autocast`` for ``precision: bf16``.

``parallelize()`` annotates the model as the recipe does: ``BeginBlock`` for the embeddings
(IPU 0), each encoder layer (IPU from ``layers_per_ipu``), the pooler and the heads (IPU 0),
and a ``recomputationCheckpoint`` on every encoder layer's output but the last.
"""
import sys

import torch
import torch.nn.functional as F

import poptorch

from .config import BertRunConfig


# --------------------------------------------------------------------------- building blocks
class FusedSelfAttention(torch.nn.Module):
    """Self-attention with one QKV matmul. Keeps the ``query``/``key``/``value`` Linear modules
    of the layer it replaces (same parameters, same names)."""

    def __init__(self, original: torch.nn.Module, num_heads: int, dropout: float):
        super().__init__()
        self.query = original.query
        self.key = original.key
        self.value = original.value
        self.num_heads = num_heads
        self.dropout = dropout

    def forward(self, hidden: torch.Tensor, mask) -> torch.Tensor:
        batch, length, width = hidden.shape
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = F.linear(hidden, weight, bias)
        qkv = qkv.view(batch, length, 3, self.num_heads, width // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return context.transpose(1, 2).reshape(batch, length, width)


class EncoderLayer(torch.nn.Module):
    """One BERT encoder layer, reusing a ``transformers`` ``BertLayer``'s sub-modules."""

    def __init__(self, layer: torch.nn.Module, num_heads: int, attention_dropout: float):
        super().__init__()
        self.attention = layer.attention
        self.attention.self = FusedSelfAttention(layer.attention.self, num_heads, attention_dropout)
        self.intermediate = layer.intermediate
        self.output = layer.output

    def forward(self, hidden: torch.Tensor, mask) -> torch.Tensor:
        attended = self.attention.output(self.attention.self(hidden, mask), hidden)
        return self.output(self.intermediate(attended), attended)


class SerializedLinear(torch.nn.Linear):
    """The MLM decoder computed with ``poptorch.serializedMatMul`` over output channels."""

    def __init__(self, in_features, out_features, factor, bias=False):
        super().__init__(in_features, out_features, bias=bias)
        self.factor = factor

    def forward(self, x):
        out = poptorch.serializedMatMul(x, self.weight.t(), poptorch.MatMulSerializationMode.OutputChannels,
                                        self.factor)
        return out if self.bias is None else out + self.bias


def _checkpoint_output(module, inputs, output):
    return poptorch.recomputationCheckpoint(output)


# --------------------------------------------------------------------------- the model
class PipelinedBertForPretraining(torch.nn.Module):
    """``forward(input_ids, attention_mask, token_type_ids, masked_lm_positions,
    masked_lm_labels=None, next_sentence_label=None)``.

    Without labels: ``(prediction_scores [B, mask_tokens, vocab], seq_relationship_scores [B, 2])``.
    With labels: ``(total_loss, mlm_loss, nsp_loss, mlm_acc, nsp_acc)``, scalars.
    """

    def __init__(self, config: BertRunConfig):
        super().__init__()
        from transformers import BertForPreTraining
        hf = BertForPreTraining(config.bert_config())
        self.config = config
        self.bert = hf.bert
        self.cls = hf.cls
        heads = config.num_attention_heads
        for index, layer in enumerate(self.bert.encoder.layer):
            self.bert.encoder.layer[index] = EncoderLayer(layer, heads, config.attention_probs_dropout_prob)
        if config.embedding_serialization_factor > 1:
            decoder = self.cls.predictions.decoder
            serialized = SerializedLinear(config.hidden_size, config.vocab_size, config.embedding_serialization_factor,
                                          bias=decoder.bias is not None)
            serialized.weight = decoder.weight
            if decoder.bias is not None:
                serialized.bias = decoder.bias
            self.cls.predictions.decoder = serialized
        self.tie_weights()

    def tie_weights(self):
        """The MLM decoder shares the word-embedding matrix."""
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def parallelize(self, log=None):
        """Annotate blocks and recomputation checkpoints; print the device allocation."""
        config = self.config
        log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        log("-------------------- Device Allocation --------------------")
        log("Embedding  --> IPU 0")
        poptorch.BeginBlock(self.bert.embeddings, "Embedding", ipu_id=0)
        layers = self.bert.encoder.layer
        for index, (layer, ipu) in enumerate(zip(layers, config.layer_ipus)):
            if config.recompute_checkpoint_every_layer and index != len(layers) - 1:
                layer.register_forward_hook(_checkpoint_output)
            poptorch.BeginBlock(layer, f"Encoder{index}", ipu_id=ipu)
            log(f"Encoder {index:<2} --> IPU {ipu}")
        log("Pooler     --> IPU 0")
        poptorch.BeginBlock(self.bert.pooler, "Pooler", ipu_id=0)
        log("Classifier --> IPU 0")
        poptorch.BeginBlock(self.cls, "Classifier", ipu_id=0)
        log("-----------------------------------------------------------")
        return self

    def forward(self, input_ids, attention_mask, token_type_ids, masked_lm_positions,
                masked_lm_labels=None, next_sentence_label=None):
        hidden = self.bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        # [B, 1, 1, S]: True where a key may be attended to.
        mask = attention_mask[:, None, None, :].to(torch.bool)
        for layer in self.bert.encoder.layer:
            hidden = layer(hidden, mask)
        pooled = self.bert.pooler(hidden)
        positions = masked_lm_positions.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        masked = hidden.gather(1, positions)
        prediction_scores, nsp_scores = self.cls(masked, pooled)
        prediction_scores = prediction_scores.float()
        nsp_scores = nsp_scores.float()
        if masked_lm_labels is None or next_sentence_label is None:
            return prediction_scores, nsp_scores

        labels = masked_lm_labels.long()
        nsp_labels = next_sentence_label.long().view(-1)
        mlm_loss = F.cross_entropy(prediction_scores.reshape(-1, prediction_scores.shape[-1]), labels.reshape(-1),
                                   ignore_index=0)
        nsp_loss = F.cross_entropy(nsp_scores.view(-1, 2), nsp_labels)
        total_loss = poptorch.identity_loss(mlm_loss + nsp_loss, reduction="none")
        with torch.no_grad():
            mlm_acc = masked_accuracy(prediction_scores, labels, ignore=0)
            nsp_acc = (nsp_scores.argmax(-1) == nsp_labels).float().mean()
        return total_loss, mlm_loss, nsp_loss, mlm_acc, nsp_acc


def masked_accuracy(scores: torch.Tensor, labels: torch.Tensor, ignore: int = 0) -> torch.Tensor:
    """Per sample, the fraction of labelled positions (label != ``ignore``) predicted right;
    averaged over the batch (as the recipe measures ``mlm_acc``: a fraction shown with '%')."""
    valid = (labels != ignore).float()
    correct = (scores.argmax(-1) == labels).float() * valid
    return (correct.sum(-1) / valid.sum(-1).clamp_min(1.0)).mean()
