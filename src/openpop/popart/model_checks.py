"""Checks on a parsed ONNX model that protobuf's parser does not make."""
from . import messages
from .errors import popart_exception


def check_text_fields(message, path: str = "model") -> None:
    """Every string field of a parsed model is text. ONNX's messages are proto2, whose parser keeps
    the bytes of a string that is not UTF-8: a damaged file would otherwise give names made of bytes,
    which fail deep inside shape inference."""
    for field, value in message.ListFields():
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        values = value if repeated else [value]
        if field.type == field.TYPE_STRING:
            if any(not isinstance(item, str) for item in values):
                raise popart_exception(messages.MODEL_FIELD_NOT_TEXT.format(field=f"{path}.{field.name}"))
        elif field.type == field.TYPE_MESSAGE:
            for index, item in enumerate(values):
                check_text_fields(item, f"{path}.{field.name}[{index}]" if repeated else f"{path}.{field.name}")
