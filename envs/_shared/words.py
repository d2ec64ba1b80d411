"""A small fixed English word list for the procedural word envs (letter counting, text reversal)."""

_TEXT = """
apple banana cherry strawberry raspberry blueberry mississippi bookkeeper committee balloon
parallel occurrence necessary accommodate embarrass millennium possession success tomorrow address
giraffe elephant kangaroo hippopotamus rhinoceros crocodile alligator penguin flamingo octopus
mountain river ocean island desert forest valley canyon glacier volcano keyboard monitor computer
algorithm function variable compiler network protocol database reinforcement learning gradient
optimizer transformer attention sequence embedding tokenizer reward breakfast lunch dinner coffee
chocolate sandwich spaghetti pepperoni cinnamon vanilla library teacher student classroom notebook
pencil eraser calendar schedule holiday butterfly dragonfly grasshopper caterpillar bumblebee
ladybug mosquito scorpion tarantula squirrel happiness kindness darkness brightness sweetness
loneliness fearlessness carelessness awareness goodness
"""

WORDS = tuple(_TEXT.split())
