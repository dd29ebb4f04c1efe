"""Your own multi-positive data in one command: prepare it, search a recipe on its dev split, train three seeds.

``make train DATA=<BEIR folder | Tevatron .jsonl>`` runs ``python -m multipos.own_data run <DATA>``
(:mod:`multipos.own_data.__main__`); :mod:`multipos.own_data.prepare` makes the data ready,
:mod:`multipos.own_data.search` chooses the recipe within a wall-time budget.
"""
