"""A drafter cut from the verifier (`polyspec distill init`), trained or not: 'distill:PATH'.

It drafts exactly as the model drafter does (own cache, the verifier's logits processing when
sampling). A reduced-vocabulary head already returns full rows with -inf outside its kept ids,
so its draft distributions are zero there and rejection sampling stays exact. Input embeddings
equal to the verifier's are shared with it rather than held twice.
"""

from __future__ import annotations

from polyspec.drafters.model import ModelDrafter
from polyspec.errors import UserError
from polyspec.models import LoadedModel


def make(argument: str, verifier: LoadedModel) -> ModelDrafter:
    from polyspec.distill.checkpoint import check_verifier, load_drafter, read_meta, share_input_embeddings

    if not argument:
        raise UserError("drafter 'distill' needs a path: distill:PATH")
    check_verifier(read_meta(argument), verifier, argument)
    dtype = next(verifier.model.parameters()).dtype
    drafter = load_drafter(argument, dtype, str(verifier.device))
    share_input_embeddings(drafter.model, verifier.model)
    draft = LoadedModel(model=drafter.model, tokenizer=verifier.tokenizer, name=argument)
    return ModelDrafter(draft, verifier.vocab_size)
