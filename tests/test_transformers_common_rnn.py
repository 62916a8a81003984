"""transformers' own common model tests, run against the RNN encoder-decoder `attn_rnn` (slow: `pytest -m slow`).

The same setup and rules as test_transformers_common.py (the Transformer): `ModelTesterMixin` and
`ConfigTester` come from the sdist of the installed transformers version, downloaded and imported by
`transformers_sdist`; our side is a model tester with a tiny config (as `MarianModelTester`), the test
classes, and a comment beside every test we skip. Three configurations run the whole mixin: Bahdanau's
(GRU, additive score, maxout readout: the default), Luong's with input feeding (LSTM, bilinear "general"
score, decoded step by step) and Luong's without it (GRU, dot score, the whole target in one RNN call), so
that every decoder path and both recurrent state layouts (GRU h; LSTM (h, c)) are covered.

What the mixin cannot check on this model, because of what the model is (modeling_rnn.py documents each):
- there is no multi-head attention: no encoder or decoder self-attention at all, and one alignment per
  decoder, not one per layer. `cross_attentions` is a one-tuple of alignments (B, T, S) without a head axis.
  The mixin's attention tests expect per-layer, per-head self-attentions; we skip those and check the
  alignments in `test_alignment_outputs` and `test_alignments_are_differentiable` instead.
- hidden states are not returned (`output_hidden_states` is accepted and has no effect; a stacked
  nn.GRU/nn.LSTM does not expose the outputs of its inner layers): we skip the hidden-state tests and check
  that the flag is accepted and changes nothing.
- the decoder reads encoder and decoder embeddings from two matrices unless `share_encoder_decoder_embeddings`
  (the papers translate between two vocabularies); test_inputs_embeds_matches_input_ids embeds the decoder
  ids with the encoder's matrix, so it runs on a shared-embedding config, and
  `test_inputs_embeds_matches_input_ids_separate_embeddings` covers the default.

Not here, as for the Transformer: transformers' `GenerationTesterMixin` (the sdist does not ship
tests/generation/); generate() with the `AttnRNNCache` is checked against reference loops in
test_modeling_rnn.py. If a later sdist ships the mixin, the ForConditionalGeneration classes pick it up.

The mixin skips further tests itself (pytest -rs shows why), none of which can apply here:
- hardware or packages this machine lacks: accelerators, MPS, flash attention 2/3/4, `kernels`, deepspeed,
  transformers' `@slow` (RUN_SLOW=1, on these tests always with an accelerator requirement);
- features an RNN model does not have: an attention backend (`_supports_sdpa` is False: the alignment
  model is the additive/bilinear score of scores.py, not scaled dot-product attention over heads, so no
  SDPA/flash/flex interface applies; the sdpa and eager-vs-sdpa tests skip), gradient checkpointing (the
  layers are inside one cuDNN-style nn.GRU/nn.LSTM), position embeddings (an RNN reads the order),
  RoPE, sliding windows, MoE, composite sub-configs, a tensor-parallel plan, `_keep_in_fp32_modules`, a
  checkpoint conversion mapping, `capture_outputs` recorders, a decoder-only LM head.
"""

from __future__ import annotations

import unittest

import pytest
import torch
import transformers_sdist
from transformers.models.auto import modeling_auto
from transformers.testing_utils import torch_device

from modeling_attn import AttnRNNCache, AttnRNNConfig, AttnRNNForConditionalGeneration, AttnRNNModel

pytestmark = pytest.mark.slow

test_modeling_common, test_configuration_common = transformers_sdist.load_common_tests()
ModelTesterMixin = test_modeling_common.ModelTesterMixin
ConfigTester = test_configuration_common.ConfigTester
ids_tensor = test_modeling_common.ids_tensor
if transformers_sdist.GENERATION_TESTER_SHIPPED:
    GenerationMixins = (test_modeling_common.GenerationTesterMixin,)
else:
    GenerationMixins = ()

# Luong's decoder step by step (input feeding), and over the whole target at once (without it).
LUONG = dict(rnn_type="lstm", decoder_style="luong", attention_score="general", input_feeding=True)
LUONG_PARALLEL = dict(rnn_type="gru", decoder_style="luong", attention_score="dot")


class AttnRNNModelTester:
    """Tiny configs and inputs for the common tests (the rnn-tiny preset: embeddings 16, 8 units per encoder
    direction, 16 decoder units, 2+2 layers, vocabulary 99)."""

    def __init__(
        self,
        parent,
        batch_size=13,
        # One length for source and target, as for the Transformer (the mixin sizes some inputs with one length).
        encoder_seq_length=7,
        decoder_seq_length=7,
        is_training=True,
        vocab_size=99,
        embedding_size=16,
        encoder_hidden_size=8,
        hidden_size=16,  # decoder_hidden_size (the config's `hidden_size`)
        num_hidden_layers=2,  # encoder_layers and decoder_layers (the config's `num_hidden_layers`)
        attention_size=16,
        readout_size=16,  # = embedding_size, so that the tied-embedding tests can tie the output projection
        dropout=0.1,
        rnn_type="gru",
        decoder_style="bahdanau",
        attention_score="additive",
        input_feeding=False,
        share_encoder_decoder_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.encoder_seq_length = encoder_seq_length
        self.decoder_seq_length = decoder_seq_length
        self.seq_length = decoder_seq_length  # the mixin sizes seq2seq `labels` with it
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.encoder_hidden_size = encoder_hidden_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.attention_size = attention_size
        self.readout_size = readout_size
        self.dropout = dropout
        self.rnn_type = rnn_type
        self.decoder_style = decoder_style
        self.attention_score = attention_score
        self.input_feeding = input_feeding
        self.share_encoder_decoder_embeddings = share_encoder_decoder_embeddings
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def get_config(self) -> AttnRNNConfig:
        return AttnRNNConfig(
            vocab_size=self.vocab_size,
            embedding_size=self.embedding_size,
            encoder_hidden_size=self.encoder_hidden_size,
            decoder_hidden_size=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            attention_size=self.attention_size,
            readout_size=self.readout_size,
            dropout=self.dropout,
            rnn_type=self.rnn_type,
            decoder_style=self.decoder_style,
            attention_score=self.attention_score,
            input_feeding=self.input_feeding,
            share_encoder_decoder_embeddings=self.share_encoder_decoder_embeddings,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
        )

    def prepare_config_and_inputs(self):
        """Source sentences ending in EOS, right-padded in every third row (the encoder packs right-padded
        sentences only); decoder inputs behind the start token."""
        input_ids = ids_tensor([self.batch_size, self.encoder_seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        attention_mask = torch.ones_like(input_ids)
        attention_mask[1::3, -2:] = 0
        input_ids = input_ids.masked_fill(attention_mask == 0, self.pad_token_id)
        decoder_input_ids = ids_tensor([self.batch_size, self.decoder_seq_length], self.vocab_size).clamp(3)
        decoder_input_ids[:, 0] = self.decoder_start_token_id
        inputs_dict = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": torch.ones_like(decoder_input_ids),
        }
        return self.get_config(), inputs_dict

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()

    def create_and_check_decoder_model_past_large_inputs(self, config, inputs_dict):
        """The decoder continuing from its `AttnRNNCache` gives the same outputs for 3 new tokens as the decoder
        on the whole sequence."""
        model = AttnRNNModel(config).to(torch_device).eval()
        encoder_hidden_states = model.get_encoder()(
            inputs_dict["input_ids"], attention_mask=inputs_dict["attention_mask"]
        ).last_hidden_state
        decoder = model.get_decoder()
        cross = {
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": inputs_dict["attention_mask"],
        }
        input_ids = inputs_dict["decoder_input_ids"]
        past_key_values = decoder(input_ids, use_cache=True, **cross).past_key_values
        self.parent.assertIsInstance(past_key_values, AttnRNNCache)
        self.parent.assertEqual(past_key_values.get_seq_length(), input_ids.shape[1])

        next_tokens = ids_tensor((self.batch_size, 3), config.vocab_size)
        next_input_ids = torch.cat([input_ids, next_tokens], dim=-1)
        without_past = decoder(next_input_ids, use_cache=False, **cross).last_hidden_state[:, -3:]
        with_past = decoder(next_tokens, past_key_values=past_key_values, **cross).last_hidden_state
        self.parent.assertEqual(with_past.shape, without_past.shape)
        torch.testing.assert_close(with_past, without_past, atol=1e-4, rtol=1e-4)
        self.parent.assertEqual(past_key_values.get_seq_length(), next_input_ids.shape[1])


class AttnRNNCommonTests(ModelTesterMixin):
    """The common tests, with what both model classes share; `tester_kwargs` picks the configuration."""

    is_encoder_decoder = True
    tester_kwargs = {}
    # The mixin runs test_can_init_all_missing_weights only for models whose configuration file has a copyright
    # year >= 2023 (ours has no copyright line) unless this is set; the test applies to us in full.
    test_can_init_all_missing_weights_before_2023 = True

    # As for the Transformer: the mixin tells a base model from a head by transformers' static auto-mapping name
    # tables (which `AutoModel.register` does not touch), so our classes are entered there while the tests run.
    auto_mapping_names = (
        (modeling_auto.MODEL_MAPPING_NAMES, AttnRNNModel),
        (modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, AttnRNNForConditionalGeneration),
    )

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        model_type = AttnRNNConfig.model_type
        for names, model_class in cls.auto_mapping_names:
            if model_type in names:
                raise RuntimeError(f"transformers already has a model type {model_type!r}")
            names[model_type] = model_class.__name__
            cls.addClassCleanup(names.pop, model_type)

    def setUp(self):
        self.model_tester = AttnRNNModelTester(self, **self.tester_kwargs)

    # -- mixin tests that do not apply to an RNN model, each replaced by what does apply ------------------

    # Expects `encoder_attentions` and `decoder_attentions` with one (B, heads, T, S) tensor per layer. The RNN
    # has no self-attention and no heads: its only attention is one alignment (B, T, S) per decoder, returned
    # as `cross_attentions`; checked by test_alignment_outputs.
    @unittest.skip(
        reason="no multi-head self-attention: one (B, T, S) alignment per decoder, see test_alignment_outputs"
    )
    def test_attention_outputs(self):
        pass

    # Expects `encoder_hidden_states` / `decoder_hidden_states` with one tensor per layer (+ embeddings). The
    # model documents that it returns no hidden states (the stacked nn.GRU/nn.LSTM does not expose its inner
    # layers); test_output_hidden_states_has_no_effect checks that the flag is accepted and changes nothing.
    @unittest.skip(
        reason="the RNN model returns no hidden states (documented); see test_output_hidden_states_has_no_effect"
    )
    def test_hidden_states_output(self):
        pass

    # Retains the gradient of hidden_states[0] and of the encoder/decoder self-attentions, none of which the RNN
    # model returns (see the two skips above). Its cross-attention part cannot hold for a decoder that runs step
    # by step either (Bahdanau; Luong with input feeding): the returned (B, T, S) alignments are concatenated
    # from the per-step alignments after the last step, so they are not upstream of the outputs and their
    # retained grad stays None. test_alignments_are_differentiable checks that they are in the graph.
    @unittest.skip(reason="needs hidden states and self-attentions, which the RNN model does not return")
    def test_retain_grad_hidden_states_attentions(self):
        pass

    def test_inputs_embeds_matches_input_ids(self):
        # The mixin embeds decoder_input_ids with get_input_embeddings() (the encoder's matrix), which is the
        # decoder's matrix only with share_encoder_decoder_embeddings; run it on such a config.
        # test_inputs_embeds_matches_input_ids_separate_embeddings covers the default, two matrices.
        self.model_tester.share_encoder_decoder_embeddings = True
        super().test_inputs_embeds_matches_input_ids()

    def test_resize_embeddings_untied(self):
        # The mixin expects resize_token_embeddings to resize the output layer, which holds when source and target
        # are one vocabulary; with two (the default), it resizes the source side only, as MarianMTModel does, and
        # resize_decoder_token_embeddings the target side and the output layer (tests/test_resize_token_embeddings.py).
        self.model_tester.share_encoder_decoder_embeddings = True
        super().test_resize_embeddings_untied()

    # -- RNN-specific replacements and additions ---------------------------------------------------------

    def test_inputs_embeds_matches_input_ids_separate_embeddings(self):
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        self.assertFalse(config.share_encoder_decoder_embeddings)
        for model_class in self.all_model_classes:
            model = model_class(config).to(torch_device).eval()
            inputs = self._prepare_for_class(inputs_dict, model_class)
            input_ids, decoder_input_ids = inputs.pop("input_ids"), inputs.pop("decoder_input_ids")
            base = model.get_encoder(), model.get_decoder()
            self.assertIsNot(base[0].embed_tokens.weight, base[1].embed_tokens.weight)
            with torch.no_grad():
                out_ids = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids, **inputs)[0]
                out_embeds = model(
                    inputs_embeds=base[0].embed_tokens(input_ids),
                    decoder_inputs_embeds=base[1].embed_tokens(decoder_input_ids),
                    **inputs,
                )[0]
            torch.testing.assert_close(out_embeds, out_ids)

    def _check_alignments(self, outputs, inputs_dict):
        batch_size = self.model_tester.batch_size
        self.assertIsNone(outputs.encoder_attentions)  # no self-attention in the encoder
        self.assertIsNone(outputs.decoder_attentions)  # nor in the decoder
        self.assertIsInstance(outputs.cross_attentions, tuple)
        self.assertEqual(len(outputs.cross_attentions), 1)  # one alignment per decoder, not per layer
        (alignments,) = outputs.cross_attentions
        self.assertEqual(
            alignments.shape, (batch_size, self.model_tester.decoder_seq_length, self.model_tester.encoder_seq_length)
        )
        source_mask = inputs_dict["attention_mask"].bool()[:, None, :].expand_as(alignments)
        torch.testing.assert_close(alignments.sum(-1), torch.ones(alignments.shape[:2], device=alignments.device))
        self.assertTrue((alignments[~source_mask] == 0).all())  # nothing on padding

    def test_alignment_outputs(self):
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).to(torch_device).eval()
            inputs = self._prepare_for_class(inputs_dict, model_class)
            with torch.no_grad():
                self.assertIsNone(model(**inputs).cross_attentions)
                self._check_alignments(model(**inputs, output_attentions=True), inputs_dict)
            # and through the config
            config_with_attentions = config.__class__(**{**config.to_dict(), "output_attentions": True})
            model = model_class(config_with_attentions).to(torch_device).eval()
            with torch.no_grad():
                self._check_alignments(model(**inputs), inputs_dict)
                self.assertIsNone(model(**inputs, output_attentions=False).cross_attentions)

    def test_output_hidden_states_has_no_effect(self):
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).to(torch_device).eval()
            inputs = self._prepare_for_class(inputs_dict, model_class)
            with torch.no_grad():
                reference = model(**inputs)
                outputs = model(**inputs, output_hidden_states=True)
            self.assertIsNone(outputs.encoder_hidden_states)
            self.assertIsNone(outputs.decoder_hidden_states)
            torch.testing.assert_close(outputs[0], reference[0])

    def test_alignments_are_differentiable(self):
        """The alignments stay in the autograd graph: a loss on them reaches the parameters that they depend on."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        model_class = self.all_model_classes[0]
        model = model_class(config).to(torch_device)
        outputs = model(**self._prepare_for_class(inputs_dict, model_class), output_attentions=True)
        (alignments,) = outputs.cross_attentions
        self.assertIsNotNone(alignments.grad_fn)
        (alignments * torch.randn_like(alignments)).sum().backward()
        # The scores compare the decoder states (all from s_0 = tanh(W_s h_1<-), the `bridge`) with the annotations
        # of the encoder RNN; the dot score has no parameters of its own.
        parameters = [model.get_decoder().bridge.weight, *model.get_encoder().rnn.parameters()]
        self.assertTrue(all(p.grad is not None and p.grad.abs().sum() > 0 for p in parameters))

    def test_decoder_model_past_with_large_inputs(self):
        self.model_tester.create_and_check_decoder_model_past_large_inputs(
            *self.model_tester.prepare_config_and_inputs()
        )

    def test_share_encoder_decoder_embeddings(self):
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsNot(model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight)
        config.share_encoder_decoder_embeddings = True
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIs(model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight)


class AttnRNNModelTest(AttnRNNCommonTests, unittest.TestCase):
    all_model_classes = (AttnRNNModel,)


class AttnRNNForConditionalGenerationTest(AttnRNNCommonTests, *GenerationMixins, unittest.TestCase):
    all_model_classes = (AttnRNNForConditionalGeneration,)

    if not transformers_sdist.GENERATION_TESTER_SHIPPED:
        # This test asserts that the test class of a generate()-capable model inherits GenerationTesterMixin;
        # the transformers sdist does not ship that mixin (see the module docstring), so it cannot hold here.
        @unittest.skip(reason="GenerationTesterMixin is not shipped in the transformers sdist")
        def test_generation_tester_mixin_inheritance(self):
            pass


class AttnRNNLuongModelTest(AttnRNNModelTest):
    tester_kwargs = LUONG


class AttnRNNLuongForConditionalGenerationTest(AttnRNNForConditionalGenerationTest):
    tester_kwargs = LUONG


class AttnRNNLuongParallelModelTest(AttnRNNModelTest):
    tester_kwargs = LUONG_PARALLEL


class AttnRNNLuongParallelForConditionalGenerationTest(AttnRNNForConditionalGenerationTest):
    tester_kwargs = LUONG_PARALLEL


class AttnRNNConfigTest(unittest.TestCase):
    def setUp(self):
        self.config_tester = ConfigTester(
            self,
            config_class=AttnRNNConfig,
            # ConfigTester's default common properties include num_attention_heads; the RNN has no attention
            # heads (one additive/bilinear alignment per decoder), so it checks the other two (as transformers'
            # own Mamba and RWKV tests do) plus vocab_size.
            common_properties=["hidden_size", "num_hidden_layers"],
            vocab_size=99,
            embedding_size=16,
            encoder_hidden_size=8,
            decoder_hidden_size=16,
            encoder_layers=2,
            decoder_layers=2,
        )

    def test_config(self):
        self.config_tester.run_common_tests()
