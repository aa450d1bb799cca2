"""The code of trace-dspy's MLflow model ("models from code"): MLflow runs this file when it loads the model.

It is logged with each compile by ``trace_dspy.workflows.serving.log_program_model``; the program itself
travels beside it as JSON (the model artifact ``program``). Nothing else imports this file.
"""

from mlflow.models import set_model

from trace_dspy.workflows.serving import TraceModel

set_model(TraceModel())
